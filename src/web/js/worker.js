// lingtab in a dedicated worker: the engine runs here, so the page's main thread never waits on the GPU or the
// network, and OPFS stores are written through sync access handles (which only workers have). Messages in:
// {id, type: "load"|"generate"|"abort"|"stats"|"bench"|"reset"|"dispose"|"ingest"|"listStores"|"storeInfo"|"deleteStore", ...};
// messages out: {id, type: "progress"|"event"|"done"|"error", ...}. The main-thread side is lingtab-client.js.
import init, { Engine, ingest, listStores, storeInfo, deleteStore } from "./lingtab.js";

let engine = null;
const aborts = new Map(); // generation id → AbortController

const reply = (id, type, payload = {}) => self.postMessage({ id, type, ...payload });
const fail = (id, e) => reply(id, "error", { message: e?.message ?? String(e) });

self.onmessage = async ({ data }) => {
  const { id, type } = data;
  try {
    switch (type) {
      case "load": {
        await init();
        const controller = new AbortController();
        aborts.set(id, controller);
        engine?.dispose();
        engine = await Engine.load({
          ...data.options,
          signal: controller.signal,
          onProgress: (progress) => reply(id, "progress", { progress }),
        });
        aborts.delete(id);
        return reply(id, "done");
      }
      case "generate": {
        if (!engine) throw new Error("load a model first");
        const controller = new AbortController();
        aborts.set(id, controller);
        try {
          for await (const event of engine.generate(data.messages, { ...data.options, signal: controller.signal })) {
            reply(id, "event", { event });
          }
        } finally {
          aborts.delete(id);
        }
        return reply(id, "done");
      }
      case "ingest": {
        await init();
        const controller = new AbortController();
        aborts.set(id, controller);
        try {
          const value = await ingest({
            ...data.options,
            signal: controller.signal,
            onProgress: (progress) => reply(id, "progress", { progress }),
          });
          return reply(id, "done", { value });
        } finally {
          aborts.delete(id);
        }
      }
      case "listStores":
        await init();
        return reply(id, "done", { value: await listStores() });
      case "storeInfo":
        await init();
        return reply(id, "done", { value: await storeInfo(data.name) });
      case "deleteStore":
        await init();
        return reply(id, "done", { value: await deleteStore(data.name) });
      case "abort":
        aborts.get(data.target)?.abort();
        return reply(id, "done");
      case "stats":
        return reply(id, "done", { value: engine ? engine.stats() : null });
      case "bench":
        if (!engine) throw new Error("no engine is loaded in this worker");
        return reply(id, "done", { value: await engine.bench(data.options ?? {}) });
      case "reset":
        engine?.reset();
        return reply(id, "done");
      case "dispose":
        engine?.dispose();
        engine = null;
        return reply(id, "done");
      default:
        throw new Error(`unknown request ${type}`);
    }
  } catch (e) {
    aborts.delete(id);
    fail(id, e);
  }
};
