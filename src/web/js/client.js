// The main-thread side of lingtab-worker.js: the same API as Engine, with the engine in a dedicated worker.
//
//   import { WorkerEngine } from "lingtab/lingtab-client.js";
//   await WorkerEngine.ingest({ model, store: "ling", onProgress });   // once: the GGUF parts into OPFS
//   const engine = await WorkerEngine.load({ store: "ling", onProgress });
//   for await (const ev of engine.generate(messages, { signal })) …
export class WorkerEngine {
  #worker;
  #next = 1;
  #pending = new Map(); // request id → { onMessage }
  #dead = null; // why the worker stopped (an Error's message), once it has

  constructor(worker) {
    this.#worker = worker;
    worker.onmessage = ({ data }) => this.#pending.get(data.id)?.onMessage(data);
    // an uncaught error in the worker (or its script failing to load): the worker is not to be trusted with more
    // requests; every pending one fails now instead of waiting forever, and the page's console is spared the
    // unhandled error event
    worker.onerror = (e) => {
      e.preventDefault?.();
      const why = e.message ? `an error in the worker: ${e.message}` : "the worker failed (its script did not load, or it crashed)";
      this.#stop(`the engine's worker stopped (${why}): load it again`);
    };
  }

  /** Ends the worker at once (whatever it is doing: a load, a reply, an ingest); every pending request fails.
   *  Later calls fail too: load again for a new engine. */
  terminate() {
    this.#stop("the engine was terminated: load it again");
  }

  #stop(message) {
    if (this.#dead) return;
    this.#dead = message;
    this.#worker.terminate();
    const pending = [...this.#pending.values()];
    this.#pending.clear();
    for (const p of pending) p.onMessage({ type: "error", message });
  }

  /** Starts a worker and loads the model in it (options as Engine.load; functions stay on this side). */
  static async load(options) {
    const worker = WorkerEngine.#spawn();
    const engine = new WorkerEngine(worker);
    const { onProgress, signal, ...rest } = options ?? {};
    const id = engine.#id();
    const onAbort = () => engine.#post({ id: engine.#id(), type: "abort", target: id });
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      await engine.#request(id, { type: "load", options: rest }, (m) => m.type === "progress" && onProgress?.(m.progress));
    } catch (e) {
      worker.terminate();
      throw e;
    } finally {
      signal?.removeEventListener("abort", onAbort);
    }
    return engine;
  }

  /** Ingests a model into an OPFS store, as ingest, in a worker of its own (where OPFS has sync access
   *  handles); onProgress and signal stay on this side. Resolves to the store's summary. */
  static ingest(options) {
    const { onProgress, signal, ...rest } = options ?? {};
    if (signal?.aborted) return Promise.reject(new Error("ingest was aborted before it began"));
    return WorkerEngine.#oneShot(async (w) => {
      const id = w.#id();
      const onAbort = () => w.#post({ id: w.#id(), type: "abort", target: id });
      signal?.addEventListener("abort", onAbort, { once: true });
      try {
        return await w.#request(id, { type: "ingest", options: rest }, (m) => m.type === "progress" && onProgress?.(m.progress));
      } finally {
        signal?.removeEventListener("abort", onAbort);
      }
    });
  }

  /** Every store in this origin's OPFS, as listStores. */
  static listStores() { return WorkerEngine.#oneShot((w) => w.#request(w.#id(), { type: "listStores" })); }
  /** One store's summary or null, as storeInfo. */
  static storeInfo(name) { return WorkerEngine.#oneShot((w) => w.#request(w.#id(), { type: "storeInfo", name })); }
  /** Deletes a store, as deleteStore (fails while an engine loaded from it is alive). */
  static deleteStore(name) { return WorkerEngine.#oneShot((w) => w.#request(w.#id(), { type: "deleteStore", name })); }

  /** Streams a reply, as Engine.generate. */
  generate(messages, options) {
    const { signal, ...rest } = options ?? {};
    if (this.#dead) return WorkerEngine.#failed();
    const id = this.#id();
    const queue = [];
    let wake = null, finished = false, failure = null;
    this.#pending.set(id, {
      onMessage: (m) => {
        if (m.type === "event") queue.push(m.event);
        else if (m.type === "error") failure = new Error(m.message);
        if (m.type !== "event") { finished = true; this.#pending.delete(id); }
        wake?.();
      },
    });
    const abort = () => this.#post({ id: this.#id(), type: "abort", target: id });
    signal?.addEventListener("abort", abort, { once: true });
    this.#post({ id, type: "generate", messages, options: rest });
    return {
      [Symbol.asyncIterator]() { return this; },
      next: async () => {
        while (!queue.length && !finished) await new Promise((r) => (wake = r));
        if (queue.length) return { value: queue.shift(), done: false };
        signal?.removeEventListener("abort", abort);
        if (failure) throw failure;
        return { value: undefined, done: true };
      },
      return: async () => { abort(); return { value: undefined, done: true }; },
    };
  }

  /** Counters of the engine (a promise here: they live in the worker). */
  stats() { return this.#request(this.#id(), { type: "stats" }); }
  bench(options) { return this.#request(this.#id(), { type: "bench", options }); }
  reset() { return this.#request(this.#id(), { type: "reset" }); }
  async dispose() {
    if (this.#dead) return;
    await this.#request(this.#id(), { type: "dispose" });
    this.#stop("the engine was disposed: load it again");
  }

  static #spawn() { return new Worker(new URL("./lingtab-worker.js", import.meta.url), { type: "module" }); }
  /** Runs one request in a worker started for it, ended after it. */
  static async #oneShot(run) {
    const w = new WorkerEngine(WorkerEngine.#spawn());
    try {
      return await run(w);
    } finally {
      w.#worker.terminate();
    }
  }

  /** What the calls on a stopped engine give: a generation that fails when iterated. */
  static #failed() {
    const error = () => Promise.reject(new Error("the engine's worker stopped: load it again"));
    return { [Symbol.asyncIterator]() { return this; }, next: error, return: async () => ({ value: undefined, done: true }) };
  }

  #id() { return this.#next++; }
  #post(message) { if (!this.#dead) this.#worker.postMessage(message); }
  #request(id, message, onOther) {
    if (this.#dead) return Promise.reject(new Error("the engine's worker stopped: load it again"));
    return new Promise((resolve, reject) => {
      this.#pending.set(id, {
        onMessage: (m) => {
          if (m.type === "done") { this.#pending.delete(id); resolve(m.value); }
          else if (m.type === "error") { this.#pending.delete(id); reject(new Error(m.message)); }
          else onOther?.(m);
        },
      });
      this.#post({ id, ...message });
    });
  }
}
