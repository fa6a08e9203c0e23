import type { BenchOptions, BenchResult, ChatMessage, EngineStats, GenerateEvent, GenerateOptions, IngestOptions, LoadOptions, StoreSummary } from "./lingtab.js";

/** The Engine API with the engine in a dedicated worker (the page never waits on the GPU). */
export declare class WorkerEngine {
  static load(options: LoadOptions): Promise<WorkerEngine>;
  /** `ingest` in a worker of its own (OPFS sync access handles); onProgress and signal stay on this side. */
  static ingest(options: IngestOptions): Promise<StoreSummary>;
  static listStores(): Promise<StoreSummary[]>;
  static storeInfo(name: string): Promise<StoreSummary | null>;
  static deleteStore(name: string): Promise<boolean>;
  generate(messages: ChatMessage[], options?: GenerateOptions): AsyncIterableIterator<GenerateEvent>;
  stats(): Promise<EngineStats>;
  /** `Engine.bench` in the worker: the rows and the table of `lingtab bench`. */
  bench(options?: BenchOptions): Promise<BenchResult>;
  reset(): Promise<void>;
  dispose(): Promise<void>;
  /** Ends the worker at once, whatever it is doing; pending calls reject, and so does every later call
   *  ("the engine's worker stopped: load it again"). An uncaught error in the worker does the same. */
  terminate(): void;
}
