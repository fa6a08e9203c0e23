// The page: stores (download into OPFS, pause/resume, files, delete), the engine in a dedicated worker
// (WorkerEngine: this thread never waits on the GPU), and a chat with streamed replies and live stats.
//
// Query parameters (for tests and slow links): ?unitBytes=N&inFlight=K set the ingest's request size and
// requests in flight (see IngestOptions in lingtab.d.ts).
import { WorkerEngine } from "./pkg/lingtab-client.js";

const HF_BASE = "https://huggingface.co/inclusionAI/Ling-3.0-flash-GGUF/resolve/29edce5130491e638f3e5ebec91fa0a5ed4f780e/Q4_K_M/";
// the pinned Ling 3.0 Flash Q4_K_M parts (as src/ingest/mod.rs LING_FLASH_PARTS)
const FLASH_PARTS = [
  ["Ling-3.0-flash-Q4_K_M-00001-of-00002.gguf", 49_995_534_208, "24ff06f1ab74546a91f7c07bd725b3015896bbe9dd82ab0e5838be9ed06a6dcf"],
  ["Ling-3.0-flash-Q4_K_M-00002-of-00002.gguf", 27_014_610_464, "1a6a8c91562b817fd8ec5b250453be696b0fc209ed8f2acdb6c13f4e17f7e188"],
];
const LOCAL_PARTS = ["lingtab-tiny-00001-of-00002.gguf", "lingtab-tiny-00002-of-00002.gguf"]
  .map((f) => new URL(`hf/lingtab/tiny-ling/resolve/main/${f}`, location.href).href);
const SOURCES = {
  local: { store: "tiny-ling", model: LOCAL_PARTS, bytes: null },
  hf: { store: "ling-3.0-flash", model: FLASH_PARTS.map(([f]) => HF_BASE + f), sha256: FLASH_PARTS.map((p) => p[2]), bytes: FLASH_PARTS.reduce((a, p) => a + p[1], 0) },
};
// a model this large streams its experts through a GPU pool by default; smaller ones keep them all resident
const STREAM_ABOVE_BYTES = 4 * 2 ** 30;

const params = new URLSearchParams(location.search);
const tuning = {};
for (const key of ["unitBytes", "inFlight"]) if (params.has(key)) tuning[key] = Number(params.get(key));

const $ = (id) => document.getElementById(id);
const el = (tag, props = {}, ...children) => {
  const e = Object.assign(document.createElement(tag), props);
  e.append(...children.filter((c) => c !== null && c !== undefined));
  return e;
};

// ---------- formatting ----------

function fmtBytes(n) {
  if (!Number.isFinite(n)) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(n) >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(i === 0 ? 0 : n < 10 ? 2 : 1)} ${units[i]}`;
}
function fmtSeconds(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "";
  s = Math.round(s);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}
const pct = (x) => `${(100 * x).toFixed(x > 0 && x < 0.1 ? 1 : 0)}%`;
const baseName = (s) => (s ?? "").split(/[/\\]/).pop();

// ---------- notices: every failure gets a plain message and what to do ----------

/** What went wrong, in words, and what to do about it. */
function explain(message, during) {
  const m = String(message ?? "");
  if (gpuLost && during !== "download" && during !== "stores") {
    return { title: "The GPU device was lost", action: "The GPU process restarted (a driver reset, a crash, or the GPU was taken away). Press Reload engine: the model loads again from this browser's storage, nothing is downloaded again." };
  }
  if (/not enough storage|quota|disk (is )?full/i.test(m)) {
    return { title: "Not enough storage for this model", action: "Free space (delete a store below, clear other site data, or free disk space), then press Download again: finished parts are kept." };
  }
  if (/device (was |is )?lost|lost the device|DeviceLost/i.test(m)) {
    return { title: "The GPU device was lost", action: "The driver reset or the GPU was taken away. Press Reload engine: the model loads again from this browser's storage, nothing is downloaded again." };
  }
  if (/no WebGPU|WebGPU adapter|navigator\.gpu/i.test(m)) {
    return { title: "WebGPU is not available", action: "Use Chrome or Edge 113 or newer on a machine with a supported GPU; check chrome://gpu that WebGPU is hardware accelerated." };
  }
  if (/expert pool of \d+ bytes holds|GPU budget of \d+ bytes does not hold/.test(m)) {
    return { title: "The expert pool is too small", action: "Give the pool at least the bytes named above (Load options), or keep every expert on the GPU if it has room, then press Reload engine." };
  }
  if (/adapter's .* needs at least|binding limit|out of memory|too large for the implementation|exceeds the|larger than the/i.test(m)) {
    return { title: "The GPU is too small for this", action: "Choose a smaller expert pool in Load options (the experts then stream from storage), or use a machine with more GPU memory." };
  }
  if (/RuntimeError: unreachable|panicked/.test(m)) {
    return { title: "The engine crashed", action: "Press Reload engine: the model loads again from this browser's storage." };
  }
  if (/sha256|changed|ETag|status \d{3}|HTTP|fetch|network|Failed to fetch/i.test(m) && during === "download") {
    return { title: "The download failed", action: "Check the connection and press Resume: what is finished is kept (a part that hashed wrong is fetched again)." };
  }
  if (during === "load") return { title: "The model could not be loaded", action: "Press Load again; if the store is damaged, delete it and download again." };
  if (during === "generate") return { title: "The reply failed", action: "Press Reload engine, then send again." };
  return { title: "Something went wrong", action: "" };
}

function showNotice({ title, text, action = "", kind = "error" }) {
  $("notice").className = `notice ${kind}`;
  $("notice-title").textContent = title;
  $("notice-text").textContent = text;
  $("notice-action").textContent = action;
  $("notice").hidden = false;
}
function showError(e, during) {
  const text = e?.message ?? String(e);
  console.error(`lingtab (${during}):`, text);
  showNotice({ ...explain(text, during), text });
}
$("notice-close").addEventListener("click", () => { $("notice").hidden = true; });

// ---------- WebGPU ----------

let gpuOk = false;
let gpuLost = null; // the GPUDeviceLostInfo message, once this page's own device was lost (a GPU process restart)
let watchDevice = null; // a small device of this page: lost together with the engine's when the GPU process goes

function onGpuLost(info) {
  if (info.reason === "destroyed") return;
  gpuLost = info.message || "device lost";
  watchDevice = null;
  $("gpu-status").textContent = "GPU device lost";
  $("gpu-status").className = "badge bad";
  if (engine || loading) {
    // the engine's device went with it: every call on it would fail
    if (generation) generation.controller.abort();
    unloadEngine().then(() => {
      $("engine-status").textContent = "The GPU device was lost: press Reload engine.";
      $("engine-status").dataset.state = "failed";
      renderStores();
    });
    showNotice({ ...explain(gpuLost, "gpu"), text: `WebGPU said: ${gpuLost}` });
  }
  // the browser starts a new GPU process; watch the next device
  setTimeout(checkGpu, 1000);
}

async function checkGpu() {
  const badge = $("gpu-status");
  if (!("gpu" in navigator)) {
    badge.textContent = "No WebGPU";
    badge.className = "badge bad";
    $("engine-status").textContent = "This browser cannot run the model here (no WebGPU); downloads still work.";
    showNotice({ title: "This browser has no WebGPU", text: "Downloads work, but the model cannot run here.",
      action: "Use Chrome or Edge 113 or newer (desktop) on a machine with a supported GPU; no flags are needed there." });
    return;
  }
  try {
    const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
    if (!adapter) throw new Error("no WebGPU adapter");
    const info = adapter.info ?? {};
    const name = [info.vendor, info.architecture, info.description].filter(Boolean).join(" ") || "WebGPU adapter";
    badge.textContent = `WebGPU: ${name} · buffers up to ${fmtBytes(adapter.limits.maxBufferSize)}`;
    badge.className = "badge ok";
    gpuOk = true;
    watchDevice = await adapter.requestDevice();
    watchDevice.lost.then(onGpuLost);
  } catch {
    badge.textContent = "No WebGPU adapter";
    badge.className = "badge bad";
    gpuOk = false;
    if (!engine) $("engine-status").textContent = "This browser cannot run the model here (no WebGPU adapter); downloads still work.";
    showNotice({ title: "WebGPU has no adapter here", text: "The browser supports WebGPU, but it offered no GPU adapter (blocked GPU, old driver, or a remote session).",
      action: "Update the GPU driver, check chrome://gpu, and make sure hardware acceleration is on in the browser's settings." });
  }
  renderStores();
}

// ---------- stores ----------

let stores = [];
let ingest = null; // { store, controller, promise }
const REMEMBER = "lingtab.stores";
const remembered = () => { try { return JSON.parse(localStorage.getItem(REMEMBER)) ?? {}; } catch { return {}; } };
function remember(store, patch) {
  const all = remembered();
  if (patch === null) delete all[store];
  else all[store] = { ...all[store], ...patch };
  localStorage.setItem(REMEMBER, JSON.stringify(all));
}

async function refreshStores() {
  try {
    stores = await WorkerEngine.listStores();
  } catch (e) {
    stores = [];
    showError(e, "stores");
  }
  renderStores();
  refreshStorage();
}

async function refreshStorage() {
  try {
    const { usage, quota } = await navigator.storage.estimate();
    const free = Math.max(0, quota - usage);
    // Chrome 138+ reports usage + min(10 GiB, disk) to every site, whatever the real quota: a whole number of GiB
    const capped = free > 0 && free % 2 ** 30 === 0;
    $("storage").textContent = capped
      ? `Storage: ${fmtBytes(usage)} used. The browser does not tell pages how much more fits (it says ${fmtBytes(free)}).`
      : `Storage: ${fmtBytes(usage)} used; this site may use ${fmtBytes(free)} more.`;
    const src = SOURCES[selectedSource()];
    if (!capped && src?.bytes > free && !stores.some((s) => s.name === src.store)) {
      $("storage").textContent += ` The ${fmtBytes(src.bytes)} model does not fit.`;
    }
  } catch {
    $("storage").textContent = "";
  }
}

function stateLabel(s) {
  if (s.state === "complete") return ["ready", "Downloaded"];
  if (ingest?.store === s.name) return ["busy", "Downloading"];
  if (s.state === "ingesting" || s.state === "empty") return ["paused", "Paused"];
  return ["", s.state];
}

function renderStores() {
  const list = $("stores");
  if (!stores.length) {
    list.replaceChildren(el("li", { className: "muted small" }, "No model stored yet."));
    updateDownloadButton();
    return;
  }
  list.replaceChildren(...stores.map((s) => {
    const [cls, label] = stateLabel(s);
    const saved = remembered()[s.name] ?? {};
    const source = s.model ?? saved.model?.[0] ?? saved.fileNames?.[0] ?? null;
    let detail = `${fmtBytes(s.modelBytes || saved.total || NaN)} model`;
    if (s.state === "complete") detail += ` · ${fmtBytes(s.bytes)} on disk`;
    else if (ingest?.store !== s.name && saved.done && saved.total) detail += ` · stopped at ${pct(saved.done / saved.total)}`;
    const buttons = [];
    if (s.state === "complete") {
      const loaded = engineStore === s.name && engine;
      buttons.push(el("button", { type: "button", className: loaded ? "" : "primary", textContent: loaded ? "Loaded" : "Load",
        disabled: !!loaded || loading || !gpuOk, title: gpuOk ? "" : "This browser has no usable WebGPU", onclick: () => loadEngine(s.name) }));
    } else if (ingest?.store !== s.name) {
      buttons.push(el("button", { type: "button", className: "primary", textContent: saved.kind === "files" ? "Resume (pick files)" : "Resume",
        disabled: !!ingest, onclick: () => resumeStore(s) }));
    }
    buttons.push(el("button", { type: "button", className: "danger", textContent: "Delete", onclick: () => removeStore(s.name) }));
    const li = el("li", { className: "store" },
      el("div", { className: "store-head" }, el("b", { textContent: s.name }), el("span", { className: `pill ${cls}`, textContent: label })),
      el("div", { className: "small muted", textContent: `${baseName(source) || "unknown source"}` }),
      el("div", { className: "small", textContent: detail }),
      el("div", { className: "row" }, ...buttons));
    li.dataset.store = s.name;
    li.dataset.state = s.state;
    return li;
  }));
  updateDownloadButton();
}

const selectedSource = () => document.querySelector("input[name=source]:checked").value;

function updateDownloadButton() {
  const b = $("download");
  const source = selectedSource();
  if (ingest && (ingest.store === SOURCES[source]?.store || source === "files")) {
    b.textContent = "Downloading…";
    b.disabled = true;
    return;
  }
  if (source === "files") {
    b.textContent = "Choose the GGUF files…";
    b.disabled = !!ingest;
    return;
  }
  const stored = stores.find((s) => s.name === SOURCES[source].store);
  b.textContent = stored?.state === "complete" ? "Downloaded" : stored ? "Resume download" : "Download";
  b.disabled = !!ingest || stored?.state === "complete";
}

function phaseText(p, fromFiles) {
  switch (p.phase) {
    case "headers": return "Reading the headers";
    case "verify": return "Checking the bytes already stored";
    case "fetch": return fromFiles ? "Copying from the files" : "Downloading";
    case "done": return "Done";
    default: return p.phase;
  }
}

/** Runs one ingest (a new download, a resume, or files): pause aborts its signal, resume is the same call again. */
async function runIngest(store, what) {
  if (ingest) return;
  const controller = new AbortController();
  const fromFiles = !!what.files;
  remember(store, fromFiles
    ? { kind: "files", fileNames: what.files.map((f) => f.name) }
    : { kind: "url", model: what.model, sha256: what.sha256 ?? null });
  const box = $("ingest-progress");
  box.hidden = false;
  delete box.dataset.resumedFrom;
  box.dataset.phase = "headers";
  box.dataset.store = store;
  $("ingest-bar").removeAttribute("value");
  $("ingest-text").textContent = `${store}: starting…`;
  $("pause").hidden = false;
  $("pause").disabled = false;
  $("notice").hidden = true;
  let lastSave = 0, resumedFrom = null;
  const onProgress = (p) => {
    box.dataset.phase = p.phase;
    box.dataset.done = p.bytesDone;
    box.dataset.total = p.bytesTotal;
    if (p.phase === "fetch" && resumedFrom === null) {
      resumedFrom = p.bytesDone;
      box.dataset.resumedFrom = p.bytesDone;
    }
    $("ingest-bar").value = p.bytesTotal ? p.bytesDone / p.bytesTotal : 0;
    const parts = [`${store}: ${phaseText(p, fromFiles)}`];
    if (p.bytesTotal) parts.push(`${fmtBytes(p.bytesDone)} of ${fmtBytes(p.bytesTotal)} (${pct(p.bytesDone / p.bytesTotal)})`);
    if (p.rate > 0 && p.phase !== "done") parts.push(`${fmtBytes(p.rate)}/s`);
    if (p.etaSeconds !== null && p.phase !== "done") parts.push(`${fmtSeconds(p.etaSeconds)} left`);
    if (resumedFrom > 0 && p.phase === "fetch") parts.push(`resumed at ${fmtBytes(resumedFrom)}`);
    $("ingest-text").textContent = parts.join(" · ");
    const now = performance.now();
    if (p.phase === "fetch" && now - lastSave > 500) {
      lastSave = now;
      remember(store, { done: p.bytesDone, total: p.bytesTotal });
    }
  };
  const promise = WorkerEngine.ingest({ ...what, store, ...tuning, signal: controller.signal, onProgress });
  ingest = { store, controller, promise };
  renderStores();
  try {
    const summary = await promise;
    remember(store, { done: null, total: null });
    box.dataset.phase = "done";
    $("ingest-bar").value = 1;
    $("ingest-text").textContent = `${store}: complete, ${fmtBytes(summary.modelBytes)} verified${summary.persisted === false ? " (the browser may evict it under storage pressure)" : ""}. Press Load.`;
  } catch (e) {
    if (controller.signal.aborted) {
      box.dataset.phase = "paused";
      $("ingest-text").textContent = `${store}: paused at ${box.dataset.total ? pct(box.dataset.done / box.dataset.total) : "the start"}. Press Resume to go on (also after closing the tab).`;
    } else {
      box.dataset.phase = "failed";
      $("ingest-text").textContent = `${store}: stopped.`;
      showError(e, "download");
    }
  } finally {
    ingest = null;
    $("pause").hidden = true;
    await refreshStores();
  }
}

async function resumeStore(s) {
  const saved = remembered()[s.name] ?? {};
  if (saved.kind === "files") {
    pickFilesFor = s.name;
    $("files").click();
    return;
  }
  // the manifest has every part's source; a store stopped before its manifest only has what this page kept
  const urls = s.parts?.length && s.parts.every((p) => /^https?:/.test(p.source)) ? s.parts.map((p) => p.source) : saved.model;
  if (!urls) {
    showNotice({ title: "This store cannot be resumed", text: `The page does not know where ${s.name} came from.`, action: "Delete it and download again." });
    return;
  }
  const sha256 = saved.sha256 ?? (s.parts?.every((p) => p.sha256) ? s.parts.map((p) => p.sha256) : undefined);
  await runIngest(s.name, { model: urls, ...(sha256 ? { sha256 } : {}) });
}

async function removeStore(name) {
  if (!confirm(`Delete the store "${name}" and its files from this browser?`)) return;
  if (ingest?.store === name) {
    ingest.controller.abort();
    await ingest.promise.catch(() => {});
  }
  if (engineStore === name) await unloadEngine();
  if (lastLoad?.store === name) lastLoad = null;
  setChatEnabled();
  try {
    await WorkerEngine.deleteStore(name);
    remember(name, null);
  } catch (e) {
    showError(e, "delete");
  }
  if ($("ingest-progress").dataset.store === name) $("ingest-progress").hidden = true;
  await refreshStores();
}

/** A store name from picked files: "model-00001-of-00002.gguf" → "model". */
function storeNameFor(files) {
  const stem = files.map((f) => f.name).sort()[0].replace(/\.gguf$/i, "").replace(/-\d{5}-of-\d{5}$/, "");
  return stem.replace(/[^A-Za-z0-9._-]+/g, "-").slice(0, 100) || "my-model";
}

let pickFilesFor = null;
$("files").addEventListener("change", () => {
  const files = [...$("files").files];
  $("files").value = "";
  if (!files.length) return;
  const bad = files.find((f) => !/\.gguf$/i.test(f.name));
  if (bad) {
    showNotice({ title: "Those are not GGUF files", text: `${bad.name} is not a .gguf file.`, action: "Pick every part of the model (…-00001-of-00002.gguf and …-00002-of-00002.gguf)." });
    return;
  }
  const store = pickFilesFor ?? storeNameFor(files);
  pickFilesFor = null;
  runIngest(store, { files });
});

$("download").addEventListener("click", () => {
  const source = selectedSource();
  if (source === "files") {
    pickFilesFor = null;
    $("files").click();
    return;
  }
  const { store, model, sha256 } = SOURCES[source];
  runIngest(store, { model, ...(sha256 ? { sha256 } : {}) });
});
$("pause").addEventListener("click", () => {
  $("pause").disabled = true;
  $("ingest-text").textContent += " · pausing…";
  ingest?.controller.abort();
});
for (const r of document.querySelectorAll("input[name=source]")) r.addEventListener("change", () => { updateDownloadButton(); refreshStorage(); });

// the tiny model's size, from the local server
Promise.all(LOCAL_PARTS.map((u) => fetch(u, { method: "HEAD" }).then((r) => (r.ok ? Number(r.headers.get("content-length")) : NaN))))
  .then((sizes) => {
    const total = sizes.reduce((a, b) => a + b, 0);
    $("local-size").textContent = Number.isFinite(total) ? `from this server, ${fmtBytes(total)}` : "not served here: start the page with bash .ci/serve";
  })
  .catch(() => { $("local-size").textContent = "not served here"; });

// ---------- the engine (in a dedicated worker) ----------

let engine = null;
let engineStore = null;
let loading = false;
let lastLoad = null; // the options of the last load, for "Reload engine"
let poolTouched = false;
$("pool-mode").addEventListener("change", () => { poolTouched = true; updatePoolField(); });
$("pool-mib").addEventListener("input", () => { poolTouched = true; });
const updatePoolField = () => { $("pool-size-field").hidden = $("pool-mode").value !== "pool"; };

function loadOptions(store) {
  const summary = stores.find((s) => s.name === store);
  if (!poolTouched) {
    $("pool-mode").value = (summary?.modelBytes ?? 0) > STREAM_ABOVE_BYTES ? "pool" : "resident";
    updatePoolField();
  }
  const options = { store };
  if ($("pool-mode").value === "pool") {
    const mib = Number($("pool-mib").value);
    if (!(mib > 0)) throw new Error("the pool size must be a positive number of MiB");
    options.poolBytes = Math.round(mib * 1024 * 1024);
    options.policy = $("policy").value;
  }
  return options;
}

function describeLoad(o) {
  return o.poolBytes ? `experts stream into a ${fmtBytes(o.poolBytes)} pool (${o.policy})` : "every expert on the GPU";
}

async function unloadEngine() {
  const old = engine;
  engine = null;
  engineStore = null;
  setChatEnabled();
  if (old) {
    $("engine-status").textContent = "No model loaded.";
    delete $("engine-status").dataset.state;
    // a worker whose device is gone may never answer: do not wait for it
    await Promise.race([old.dispose().catch(() => {}), new Promise((r) => setTimeout(r, 2000))]);
  }
}

async function loadEngine(store, options = null) {
  if (loading) return;
  try {
    options ??= loadOptions(store);
  } catch (e) {
    showError(e, "load");
    return;
  }
  if (generation) generation.controller.abort();
  loading = true;
  lastLoad = options;
  if (watchDevice) gpuLost = null;
  await unloadEngine();
  $("notice").hidden = true;
  $("engine-status").textContent = `Loading ${store} (${describeLoad(options)})…`;
  $("engine-status").dataset.state = "loading";
  const box = $("load-progress");
  box.hidden = false;
  $("load-bar").removeAttribute("value");
  $("load-text").textContent = "Starting the engine…";
  renderStores();
  setChatEnabled();
  const started = performance.now();
  try {
    engine = await WorkerEngine.load({
      ...options,
      onProgress: (p) => {
        if (p.phase === "header") { $("load-text").textContent = "Reading the headers…"; return; }
        $("load-bar").value = p.total ? p.loaded / p.total : 0;
        $("load-text").textContent = `Weights to the GPU: ${fmtBytes(p.loaded)} of ${fmtBytes(p.total)}`;
      },
    });
    engineStore = store;
    const stats = await engine.stats();
    const adapter = stats.adapter.split(" [")[0] || "WebGPU";
    $("engine-status").textContent = `Ready: ${store} on ${adapter} · ${describeLoad(options)} · loaded in ${((performance.now() - started) / 1000).toFixed(1)} s`;
    $("engine-status").title = stats.adapter;
    $("engine-status").dataset.state = "ready";
    showStats(stats);
    // the finished download's line has done its job
    if ($("ingest-progress").dataset.phase === "done" && !ingest) $("ingest-progress").hidden = true;
  } catch (e) {
    engine = null;
    $("engine-status").textContent = `Not loaded: ${store} failed to load.`;
    $("engine-status").dataset.state = "failed";
    showError(e, "load");
  } finally {
    loading = false;
    box.hidden = true;
    renderStores();
    setChatEnabled();
  }
}

// the same store again, with the load options as they are now
$("reload-engine").addEventListener("click", () => {
  if (lastLoad) loadEngine(lastLoad.store);
});

// ---------- chat ----------

let history = []; // ChatMessage[] sent with every turn (the engine reuses what it already holds)
let generation = null; // { controller }

function setChatEnabled() {
  $("send").disabled = !engine || !!generation || loading;
  $("stop").disabled = !generation;
  $("reload-engine").disabled = !lastLoad || loading;
  $("chat").dataset.busy = generation ? "generating" : "";
}

function readSettings() {
  const num = (id, name, { min = 0, max = Infinity, int = false } = {}) => {
    const v = Number($(id).value);
    if ($(id).value === "" || !Number.isFinite(v) || v < min || v > max || (int && !Number.isInteger(v))) {
      throw new Error(`${name} must be ${int ? "a whole number" : "a number"} from ${min}${max < Infinity ? ` to ${max}` : " up"}`);
    }
    return v;
  };
  const seedText = $("seed").value.trim();
  return {
    thinking: $("thinking").checked,
    temperature: num("temperature", "Temperature", { max: 2 }),
    topP: num("top-p", "Top-p", { max: 1 }),
    topK: num("top-k", "Top-k", { int: true }),
    maxTokens: num("max-tokens", "Max tokens", { min: 1, int: true }),
    seed: seedText === "" ? Math.floor(Math.random() * 2 ** 32) : num("seed", "Seed", { int: true, max: Number.MAX_SAFE_INTEGER }),
  };
}

function addMessage(role) {
  $("messages").querySelector(".empty")?.remove();
  const body = el("div", { className: "answer" });
  const reasoningText = el("div", { className: "reasoning-text" });
  const summary = el("summary", { textContent: "Reasoning" });
  const reasoning = el("details", { className: "reasoning", hidden: true }, summary, reasoningText);
  const meta = el("div", { className: "meta small muted" });
  const msg = el("article", { className: `msg ${role}` }, el("div", { className: "role", textContent: role === "user" ? "You" : "Ling" }),
    role === "assistant" ? reasoning : null, body, role === "assistant" ? meta : null);
  $("messages").append(msg);
  return { msg, body, reasoning, reasoningText, summary, meta };
}

function scrollToEnd() {
  const box = $("messages");
  if (box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
}

const FINISH = { stop: "", stop_string: "stopped at a stop string", length: "reached the token limit", abort: "stopped", context_full: "the context is full: start a new chat" };

async function send(text) {
  let options;
  try {
    options = readSettings();
  } catch (e) {
    showNotice({ title: "Check the sampling settings", text: e.message, action: "" });
    return;
  }
  history.push({ role: "user", content: text });
  addMessage("user").body.textContent = text;
  const view = addMessage("assistant");
  view.msg.dataset.state = "streaming";
  view.body.classList.add("pending");
  view.body.textContent = "…";
  const controller = new AbortController();
  generation = { controller };
  setChatEnabled();
  scrollToEnd();
  let content = "", reasoning = "", finish = null, tokens = 0, events = 0;
  const poll = setInterval(() => engine?.stats().then(showStats, () => {}), 1000);
  try {
    for await (const ev of engine.generate(history, { ...options, signal: controller.signal })) {
      events++;
      if (ev.token !== null) tokens++;
      if (ev.reasoning) {
        reasoning += ev.reasoning;
        view.reasoning.hidden = false;
        if (!content) view.reasoning.open = true;
        view.reasoningText.textContent = reasoning;
        view.summary.textContent = content ? "Reasoning" : "Reasoning…";
      }
      if (ev.text) {
        if (!content) { view.reasoning.open = false; view.summary.textContent = "Reasoning"; }
        content += ev.text;
      }
      view.body.classList.toggle("pending", !content);
      view.body.textContent = content || (reasoning ? "" : "…");
      view.msg.dataset.tokens = tokens;
      view.meta.textContent = `${tokens} token${tokens === 1 ? "" : "s"}…`;
      if (ev.finishReason) finish = ev.finishReason;
      scrollToEnd();
    }
  } catch (e) {
    finish = "error";
    showError(e, "generate");
  } finally {
    clearInterval(poll);
    generation = null;
    view.msg.dataset.state = "done";
    view.msg.dataset.finish = finish ?? "";
    view.summary.textContent = "Reasoning";
    if (!content) view.body.textContent = finish === "error" ? "(failed)" : reasoning ? "" : "(no answer)";
    view.body.classList.toggle("pending", !content && !reasoning);
    if (tokens || content || reasoning) history.push({ role: "assistant", content, ...(reasoning ? { reasoning_content: reasoning } : {}) });
    const stats = engine ? await engine.stats().catch(() => null) : null;
    if (stats) showStats(stats);
    const why = finish === "error" ? "failed" : FINISH[finish] ?? "";
    view.meta.textContent = [`${tokens} token${tokens === 1 ? "" : "s"}`,
      stats?.tokensPerSecond ? `${stats.tokensPerSecond.toFixed(2)} tok/s` : null, `seed ${options.seed}`, why || null].filter(Boolean).join(" · ");
    setChatEnabled();
    $("input").focus();
  }
}

function showStats(s) {
  if (!s) return;
  $("stat-tps").textContent = s.generatedTokens ? `${s.tokensPerSecond.toFixed(2)} tok/s` : "–";
  $("stat-prompt").textContent = s.promptTokens ? `${s.promptTokens} tok · ${s.promptTokensPerSecond.toFixed(1)} tok/s` : "–";
  const x = s.experts ?? {};
  if (x.policy === "resident") {
    $("stat-hits").textContent = "all resident";
  } else {
    const n = (x.hits ?? 0) + (x.misses ?? 0);
    $("stat-hits").textContent = n ? `${pct(x.hitRate)} (${x.policy})` : "–";
  }
  $("stat-read").textContent = x.tokens ? `${fmtBytes(x.bytesRead / x.tokens)}` : "–";
  $("stat-ctx").textContent = `${s.position} / ${s.contextLength}`;
  $("stats").dataset.tokensPerSecond = s.tokensPerSecond;
  $("stats").dataset.generatedTokens = s.generatedTokens;
  $("stats").dataset.position = s.position;
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || $("send").disabled) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => {
  generation?.controller.abort();
  $("stop").disabled = true;
});
$("new-chat").addEventListener("click", async () => {
  if (generation) {
    generation.controller.abort();
    while (generation) await new Promise((r) => setTimeout(r, 50));
  }
  history = [];
  $("messages").replaceChildren(el("p", { className: "empty muted" }, "New chat. Messages appear here."));
  if (engine) {
    try {
      await engine.reset();
      showStats(await engine.stats());
    } catch (e) {
      showError(e, "generate");
    }
  }
  $("input").focus();
});
$("temperature").addEventListener("input", () => { $("temperature-value").textContent = Number($("temperature").value).toFixed(2); });
$("temperature-value").textContent = Number($("temperature").value).toFixed(2);

// ---------- start ----------

updatePoolField();
setChatEnabled();
await Promise.all([checkGpu(), refreshStores()]);
document.body.dataset.ready = "true";
