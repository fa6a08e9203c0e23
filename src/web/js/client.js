// The main-thread side of lingtab-worker.js: the same API as Engine, with the engine in a dedicated worker.
//
//   import { WorkerEngine } from "lingtab/lingtab-client.js";
//   const engine = await WorkerEngine.load({ model, onProgress });
//   for await (const ev of engine.generate(messages, { signal })) …
export class WorkerEngine {
  #worker;
  #next = 1;
  #pending = new Map(); // request id → { onMessage }

  constructor(worker) {
    this.#worker = worker;
    worker.onmessage = ({ data }) => this.#pending.get(data.id)?.onMessage(data);
    worker.onerror = (e) => {
      for (const p of this.#pending.values()) p.onMessage({ type: "error", message: e.message ?? "the lingtab worker failed" });
    };
  }

  /** Starts a worker and loads the model in it (options as Engine.load; functions stay on this side). */
  static async load(options) {
    const worker = new Worker(new URL("./lingtab-worker.js", import.meta.url), { type: "module" });
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

  /** Streams a reply, as Engine.generate. */
  generate(messages, options) {
    const { signal, ...rest } = options ?? {};
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
  reset() { return this.#request(this.#id(), { type: "reset" }); }
  async dispose() {
    await this.#request(this.#id(), { type: "dispose" });
    this.#worker.terminate();
  }

  #id() { return this.#next++; }
  #post(message) { this.#worker.postMessage(message); }
  #request(id, message, onOther) {
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
