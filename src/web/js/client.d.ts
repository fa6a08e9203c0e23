import type { ChatMessage, EngineStats, GenerateEvent, GenerateOptions, LoadOptions } from "./lingtab.js";

/** The Engine API with the engine in a dedicated worker (the page never waits on the GPU). */
export declare class WorkerEngine {
  static load(options: LoadOptions): Promise<WorkerEngine>;
  generate(messages: ChatMessage[], options?: GenerateOptions): AsyncIterableIterator<GenerateEvent>;
  stats(): Promise<EngineStats>;
  reset(): Promise<void>;
  dispose(): Promise<void>;
}
