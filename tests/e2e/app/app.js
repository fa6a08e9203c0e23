// Exercises the npm package the way a web app would, and leaves what happened in window.lingtabResults.
import init, { Engine } from "lingtab";
import { WorkerEngine } from "lingtab/client";

const out = document.getElementById("out");
const results = {};

async function collect(engine, messages, options, onToken) {
  const tokens = [];
  let text = "", reasoning = "", finish = null;
  for await (const ev of engine.generate(messages, options)) {
    if (ev.token !== null) tokens.push(ev.token);
    text += ev.text;
    reasoning += ev.reasoning;
    finish = ev.finishReason ?? finish;
    out.textContent += ev.text;
    onToken?.(tokens.length);
  }
  return { tokens, text, reasoning, finish };
}

/** SHA-256 (hex) of a file of an OPFS store, read straight from OPFS. */
async function storeFileSha(store, file) {
  const root = await navigator.storage.getDirectory();
  const dir = await (await root.getDirectoryHandle("lingtab-stores")).getDirectoryHandle(store);
  const bytes = await (await (await dir.getFileHandle(file)).getFile()).arrayBuffer();
  return [...new Uint8Array(await crypto.subtle.digest("SHA-256", bytes))].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** Ingests into a new store with the worker terminated mid-fetch three times, then resumed to the end; returns
 *  what each resume started from and whether the files equal those of `reference` (an uninterrupted ingest). */
/** Two workers on one store, as two tabs are: a second ingest and a load while one ingests, then an ingest and a
 *  delete while an engine from the store lives; what each gave (a message when refused). */
async function twoTabs(model, store) {
  const outcome = (p) => p.then((v) => v?.state ?? v ?? "ok", (e) => `refused: ${e.message}`);
  let began;
  const running = new Promise((r) => (began = r));
  // small requests, one at a time: the first ingest runs for seconds
  const first = WorkerEngine.ingest({ model, store, unitBytes: 128 << 10, inFlight: 1, onProgress: (p) => p.phase === "fetch" && began() });
  await running;
  const r = {};
  [r.secondIngest, r.loadDuringIngest] = await Promise.all([
    outcome(WorkerEngine.ingest({ model, store })),
    outcome(WorkerEngine.load({ store }).then((e) => e.dispose())),
  ]);
  r.firstStillRunning = await Promise.race([first.then(() => false, () => false), Promise.resolve(true)]);
  r.first = await outcome(first);
  const engine = await WorkerEngine.load({ store });
  r.ingestUnderEngine = await outcome(WorkerEngine.ingest({ model, store }));
  r.deleteUnderEngine = await outcome(WorkerEngine.deleteStore(store));
  r.engineAfter = (await engine.stats()).contextLength > 0;
  await engine.dispose();
  r.deleteAfter = await outcome(WorkerEngine.deleteStore(store));
  return r;
}

async function killedIngests(model, reference) {
  const store = `${reference}-killed`;
  const options = { model, store, unitBytes: 1 << 20 };
  const resumes = [];
  for (const after of [2, 6, 11]) {
    // the worker entry itself, so the page can terminate it (what closing the tab does)
    const worker = new Worker(new URL("/node_modules/lingtab/lingtab-worker.js", location.href), { type: "module" });
    const seen = await new Promise((resolve, reject) => {
      let fetches = 0, first = null, last = 0;
      worker.onmessage = ({ data }) => {
        if (data.type === "error") return reject(new Error(data.message));
        if (data.type === "done") return reject(new Error("the ingest finished before it was terminated"));
        const p = data.progress;
        if (p.phase !== "fetch") return;
        first ??= p.bytesDone;
        last = p.bytesDone;
        if (++fetches === after) { worker.terminate(); resolve({ first, last }); }
      };
      worker.postMessage({ id: 1, type: "ingest", options });
    });
    resumes.push(seen);
  }
  const phases = [];
  let resumedFrom = null;
  const summary = await WorkerEngine.ingest({ ...options, onProgress: (p) => {
    phases.push(p.phase);
    if (p.phase === "fetch") resumedFrom ??= p.bytesDone;
  } });
  resumes.push({ first: resumedFrom, last: summary.modelBytes });
  const same = {};
  for (const f of ["data.bin", "manifest.json"]) same[f] = (await storeFileSha(store, f)) === (await storeFileSha(reference, f));
  same.manifestSha = JSON.stringify(summary.parts.map((p) => p.sha256)) === JSON.stringify((await WorkerEngine.storeInfo(reference)).parts.map((p) => p.sha256));
  await WorkerEngine.deleteStore(store);
  return { resumes, same, state: summary.state, phases: [...new Set(phases)] };
}

try {
  await init();
  const model = new URL(new URLSearchParams(location.search).get("model"), location.href).href;
  const progress = [];
  const engine = await Engine.load({ model, onProgress: (p) => progress.push([p.phase, p.loaded, p.total]) });
  results.progress = { events: progress.length, last: progress.at(-1) };
  const messages = [{ role: "user", content: "Hi" }];
  results.promptTokens = Array.from(engine.promptTokens(messages, false));

  results.greedy = await collect(engine, messages, { maxTokens: 8, temperature: 0, thinking: false });
  results.seeded = [];
  for (const seed of [7, 7]) {
    results.seeded.push((await collect(engine, messages, { maxTokens: 4, temperature: 0.9, topP: 0.95, seed, thinking: false })).tokens);
  }

  // stop within one token of the abort, then keep using the engine
  const controller = new AbortController();
  results.abort = await collect(engine, messages, { maxTokens: 40, temperature: 0, thinking: false, signal: controller.signal },
    (n) => { if (n === 2) controller.abort(); });

  // one generation at a time; bad options are clear errors
  const first = engine.generate(messages, { maxTokens: 1, temperature: 0, thinking: false });
  try { engine.generate(messages, {}); results.twice = "no error"; } catch (e) { results.twice = e.message; }
  for await (const _ of first) { /* drain */ }
  try { engine.generate(messages, { temperature: NaN }); results.nan = "no error"; } catch (e) { results.nan = e.message; }
  try { await Engine.load({}); results.noModel = "no error"; } catch (e) { results.noModel = e.message; }
  results.stats = engine.stats();
  engine.dispose();

  // the same API with the engine in a dedicated worker
  const worker = await WorkerEngine.load({ model });
  results.worker = await collect(worker, messages, { maxTokens: 2, temperature: 0, thinking: false });
  results.workerStats = await worker.stats();
  await worker.dispose();

  // a store: ingested in a worker (OPFS sync access handles), loaded without the network, listed, deleted
  const store = `e2e-${Date.now()}`;
  const phases = [];
  results.ingest = await WorkerEngine.ingest({ model, store, unitBytes: 1 << 20, onProgress: (p) => phases.push(p.phase) });
  results.ingestPhases = [...new Set(phases)];
  const fromStore = await WorkerEngine.load({ store });
  results.storeGreedy = await collect(fromStore, messages, { maxTokens: 2, temperature: 0, thinking: false });
  await fromStore.dispose();
  results.killed = await killedIngests(model, store);
  results.twoTabs = await twoTabs(model, `${store}-two`);
  results.listed = (await WorkerEngine.listStores()).find((s) => s.name === store) ?? null;
  results.deleted = await WorkerEngine.deleteStore(store);
  results.afterDelete = await WorkerEngine.storeInfo(store);
} catch (e) {
  results.error = String(e?.stack ?? e);
}
window.lingtabResults = results;
