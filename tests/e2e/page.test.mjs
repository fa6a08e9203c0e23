// The page (www/) in headless Chromium (WebGPU on SwiftShader), driven by Playwright like a person would: a real
// `lingtab serve` with the mounts of .ci/serve (the page, the wasm package, the tiny model laid out like Hugging
// Face), real OPFS, the engine in a real dedicated worker. A screenshot of each step goes to
// LINGTAB_E2E_SCREENSHOTS (default target/e2e/screenshots).
//
//   LINGTAB_E2E_MODEL_DIR=DIR   the tiny model (lingtab make-tiny --out DIR --seed 1)
//   LINGTAB_E2E_PKG=DIR         the built package (default pkg, from .ci/build-pkg)
//   LINGTAB_BIN=PATH            the lingtab binary (default target/debug/lingtab)
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, rmSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { chromium } from "playwright-core";
import { CHROMIUM_ARGS } from "./chromium.mjs";

const lingtab = process.env.LINGTAB_BIN ?? "target/debug/lingtab";
const modelDir = process.env.LINGTAB_E2E_MODEL_DIR;
const pkgDir = process.env.LINGTAB_E2E_PKG ?? "pkg";
const shots = path.resolve(process.env.LINGTAB_E2E_SCREENSHOTS ?? "target/e2e/screenshots");
const PARTS = ["lingtab-tiny-00001-of-00002.gguf", "lingtab-tiny-00002-of-00002.gguf"];

let server, base;

async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

before(async () => {
  assert.ok(modelDir && PARTS.every((p) => existsSync(path.join(modelDir, p))),
    `LINGTAB_E2E_MODEL_DIR must hold ${PARTS.join(", ")} (lingtab make-tiny --out DIR --seed 1); got ${modelDir}`);
  assert.ok(existsSync(path.join(pkgDir, "lingtab.js")) && existsSync(path.join(pkgDir, "lingtab-client.js")),
    `LINGTAB_E2E_PKG (${pkgDir}) must hold the built package (bash .ci/build-pkg)`);
  assert.ok(existsSync(lingtab), `no lingtab binary at ${lingtab} (cargo build --bin lingtab, or set LINGTAB_BIN)`);
  rmSync(shots, { recursive: true, force: true });
  mkdirSync(shots, { recursive: true });
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  // the mounts of .ci/serve: the page at /, the package at /pkg, the model under Hugging Face's resolve layout
  server = spawn(lingtab, ["serve", "--port", String(port), "--mount", "/=www", "--mount", `/pkg=${pkgDir}`,
    "--mount", `/hf/lingtab/tiny-ling/resolve/main=${modelDir}`], { stdio: ["ignore", "ignore", "inherit"] });
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`${base}/index.html`)).ok) break;
    } catch { /* not up yet */ }
    assert.ok(i < 100 && server.exitCode === null, "lingtab serve did not come up");
    await new Promise((r) => setTimeout(r, 100));
  }
});

after(() => server?.kill());

/** Headless Chromium with WebGPU on SwiftShader (tests/e2e/chromium.mjs), with extra switches. */
const launchWith = (...extra) => chromium.launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", headless: true, args: [...CHROMIUM_ARGS, ...extra] });

/** Opens a page that records its errors; `shot(name)` saves a full-page screenshot with a step number. */
async function open(browser, prefix, query = "") {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  const logs = [];
  page.on("pageerror", (e) => errors.push(e.message));
  page.on("console", (m) => logs.push(`${m.type()}: ${m.text()}`));
  page.on("dialog", (d) => d.accept());
  await page.goto(`${base}/${query}`);
  await page.waitForSelector("body[data-ready=true]", { timeout: 30_000 });
  let n = 0;
  const started = Date.now();
  const shot = async (name) => {
    const file = path.join(shots, `${prefix}-${String(++n).padStart(2, "0")}-${name}.png`);
    await page.screenshot({ path: file, fullPage: true });
    console.log(`  [${((Date.now() - started) / 1000).toFixed(1)} s] ${name}: ${file}`);
  };
  return { page, errors, logs, shot };
}

const text = (page, sel) => page.locator(sel).innerText();
const storeCard = (page, name) => page.locator(`#stores li[data-store="${name}"]`);

test("a download that does not fit the quota is refused before it starts, with the ingest's message", { timeout: 120_000 }, async () => {
  // Chromium 138+ reports a static quota (usage + 10 GiB) to pages; without that feature estimate() reports the
  // real quota, which DevTools sets here to 8 MB, less than the 28 MB tiny model
  const browser = await launchWith("--disable-features=StaticStorageQuota");
  try {
    const { page, errors, logs, shot } = await open(browser, "quota");
    const cdp = await page.context().newCDPSession(page);
    await cdp.send("Storage.overrideQuotaForOrigin", { origin: base, quotaSize: 8e6 });
    const est = await page.evaluate(() => navigator.storage.estimate());
    assert.equal(est.quota, 8e6, `the quota override did not reach navigator.storage.estimate(): ${JSON.stringify(est)}`);
    await page.click("#download");
    await page.waitForSelector("#notice:not([hidden])", { timeout: 60_000 });
    assert.equal(await text(page, "#notice-title"), "Not enough storage for this model");
    assert.match(await text(page, "#notice-text"), /not enough storage: the store needs \d+ more bytes .* the browser allows this site \d+ more/);
    assert.match(await text(page, "#notice-action"), /Free space/);
    // refused before anything was written
    const { usage } = await cdp.send("Storage.getUsageAndQuota", { origin: base });
    assert.ok(usage < 1e6, `the refused ingest wrote ${usage} bytes`);
    await page.waitForFunction(() => !document.querySelector("#download").disabled);
    await shot("quota-refused");
    assert.deepEqual(errors, [], logs.join("\n"));
  } finally {
    await browser.close();
  }
});

test("the worker client: an error in the worker fails every pending call and every later one; terminate() ends it at once", { timeout: 60_000 }, async () => {
  const browser = await launchWith();
  try {
    const { page, errors, logs } = await open(browser, "worker");
    const r = await page.evaluate(async () => {
      const { WorkerEngine } = await import("/pkg/lingtab-client.js");
      const worker = (src) => new Worker(URL.createObjectURL(new Blob([src], { type: "text/javascript" })));
      const outcome = (p) => p.then((v) => ({ ok: v ?? null }), (e) => ({ error: e.message }));
      // a worker that never answers, then throws
      const crashing = new WorkerEngine(worker("onmessage = () => {}; setTimeout(() => { throw new Error('boom in the worker'); }, 300);"));
      const pending = Promise.all([outcome(crashing.stats()), outcome(crashing.reset()), outcome(crashing.generate([{ role: "user", content: "hi" }]).next())]);
      const crashed = await pending;
      const later = [await outcome(crashing.stats()), await outcome(crashing.generate([{ role: "user", content: "hi" }]).next())];
      // terminate(): a worker stuck in a loop, with a request in flight
      const busy = new WorkerEngine(worker("onmessage = () => { for (;;) {} };"));
      const inFlight = outcome(busy.stats());
      const t0 = performance.now();
      busy.terminate();
      const terminated = await inFlight;
      const ms = performance.now() - t0;
      const afterTerminate = await outcome(busy.reset());
      const disposed = await outcome(busy.dispose());
      return { crashed, later, terminated, ms, afterTerminate, disposed };
    });
    for (const c of r.crashed) assert.match(c.error ?? "", /^the engine's worker stopped \(an error in the worker: .*boom in the worker\): load it again$/, JSON.stringify(r));
    for (const c of r.later) assert.equal(c.error, "the engine's worker stopped: load it again", JSON.stringify(r));
    assert.equal(r.terminated.error, "the engine was terminated: load it again");
    assert.ok(r.ms < 1000, `terminate() took ${r.ms} ms to fail the pending call`);
    assert.equal(r.afterTerminate.error, "the engine's worker stopped: load it again");
    assert.deepEqual(r.disposed, { ok: null }, "dispose() of a stopped engine is a no-op");
    assert.deepEqual(errors, [], logs.join("\n"));
  } finally {
    await browser.close();
  }
});

test("without a WebGPU adapter the page says so and what to do", { timeout: 60_000 }, async () => {
  // the same Chromium without its WebGPU switches: Linux Chromium has no WebGPU by default
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", headless: true,
    args: CHROMIUM_ARGS.filter((a) => !/webgpu|vulkan/i.test(a)).concat("--disable-features=WebGPUService,Vulkan", "--disable-gpu") });
  try {
    const { page, errors, logs, shot } = await open(browser, "nogpu");
    assert.match(await page.locator("#gpu-status").getAttribute("class"), /\bbad\b/);
    assert.match(await text(page, "#notice-title"), /^(This browser has no WebGPU|WebGPU has no adapter here)$/);
    assert.match(await text(page, "#notice-action"), /Chrome or Edge 113|chrome:\/\/gpu/);
    assert.match(await text(page, "#engine-status"), /cannot run the model here/);
    assert.equal(await page.locator("#send").isDisabled(), true);
    await shot("no-webgpu");
    assert.deepEqual(errors, [], logs.join("\n"));
  } finally {
    await browser.close();
  }
});

test("the page: download into OPFS, pause, reload mid-download and resume, load, chat, stop, new chat, pool, lost device, files, delete", { timeout: 240_000 }, async () => {
  // --enable-gpu-benchmarking gives the page chrome.gpuBenchmarking, whose terminateGpuProcessNormally() ends the GPU
  // process: every WebGPU device is lost, as in a driver reset
  const browser = await launchWith("--enable-gpu-benchmarking");
  try {
    // small requests one at a time, so the download can be interrupted
    const { page, errors, logs, shot } = await open(browser, "page", "?unitBytes=262144&inFlight=1");
    const fail = (what) => `${what}\n--- page console ---\n${logs.join("\n")}`;

    // 1. the page, with WebGPU found and nothing stored yet
    assert.match(await page.locator("#gpu-status").getAttribute("class"), /\bok\b/, fail(await text(page, "#gpu-status")));
    assert.match(await text(page, "#stores"), /No model stored yet/);
    assert.match(await text(page, "#local-size"), /MB/);
    assert.equal(await page.locator("#send").isDisabled(), true);
    await shot("opened");

    // 2. the browser's enforced quota (DevTools: 8 MB) stops the download with a plain message; more room, resume
    const cdp = await page.context().newCDPSession(page);
    await cdp.send("Storage.overrideQuotaForOrigin", { origin: base, quotaSize: 8e6 });
    await page.click("#download");
    await page.waitForSelector("#notice:not([hidden])", { timeout: 60_000 });
    assert.equal(await text(page, "#notice-title"), "Not enough storage for this model", fail(await text(page, "#notice")));
    // the write-time error (QuotaExceededError, or Chromium's odd write count at the quota) in the ingest's words
    assert.match(await text(page, "#notice-text"), /not enough storage: .*(quota|wrote \d+ of the \d+ bytes).*resumes where it stopped/s);
    await page.waitForSelector('#stores li[data-store="tiny-ling"] button:text-is("Resume")');
    await shot("quota-exceeded");
    await cdp.send("Storage.overrideQuotaForOrigin", { origin: base });

    // 3. a slow download (every request of the model delayed): paused, resumed, then the page reloaded in the middle
    const slow = async (route) => { await new Promise((r) => setTimeout(r, 80)); await route.continue(); };
    await page.route("**/hf/lingtab/**", slow);
    const reached = (fraction) => page.waitForFunction((f) => {
      const d = document.querySelector("#ingest-progress").dataset;
      return d.phase === "fetch" && Number(d.done) >= f * Number(d.total);
    }, fraction, { timeout: 60_000, polling: 50 });
    await storeCard(page, "tiny-ling").locator('button:text-is("Resume")').click();
    await reached(0.1);
    await page.click("#pause");
    await page.waitForSelector("#ingest-progress[data-phase=paused]", { timeout: 30_000 });
    const paused = Number(await page.locator("#ingest-progress").getAttribute("data-done"));
    assert.match(await text(page, "#ingest-text"), /paused at \d+%/);
    assert.equal(await storeCard(page, "tiny-ling").getAttribute("data-state"), "ingesting");
    await shot("paused");
    await storeCard(page, "tiny-ling").locator('button:text-is("Resume")').click();
    await page.waitForSelector("#ingest-progress[data-resumed-from]", { timeout: 30_000 });
    const afterPause = Number(await page.locator("#ingest-progress").getAttribute("data-resumed-from"));
    assert.ok(afterPause >= paused, `resumed from ${afterPause} after a pause at ${paused}`);
    await reached(0.3);
    const before = await page.locator("#ingest-progress").evaluate((e) => ({ ...e.dataset }));
    assert.ok(Number(before.done) < Number(before.total), `the download finished before the reload: ${JSON.stringify(before)}`);
    assert.match(await text(page, "#ingest-text"), /Downloading · [\d.]+ MB of [\d.]+ MB \(\d+%\) · [\d.]+ [kM]B\/s/);
    assert.equal(await page.locator("#pause").isVisible(), true);
    await shot("downloading");
    await page.reload();
    await page.waitForSelector("body[data-ready=true]");
    await page.unroute("**/hf/lingtab/**", slow);
    const card = storeCard(page, "tiny-ling");
    assert.equal(await card.getAttribute("data-state"), "ingesting");
    assert.match(await card.innerText(), /Paused[\s\S]*stopped at \d+%/);
    await shot("reloaded-mid-download");
    await card.locator('button:text-is("Resume")').click();
    await page.waitForSelector("#ingest-progress[data-phase=done]", { timeout: 60_000 });
    const resumed = Number(await page.locator("#ingest-progress").getAttribute("data-resumed-from"));
    assert.ok(resumed >= Number(before.done), `resumed from ${resumed}, but ${before.done} bytes were done before the reload`);
    await page.waitForSelector('#stores li[data-store="tiny-ling"][data-state=complete]');
    assert.match(await text(page, "#ingest-text"), /complete, 28\.0 MB verified/);
    await shot("downloaded");

    // 4. load from the store (every expert resident: the tiny model's default)
    await card.locator('button:text-is("Load")').click();
    await page.waitForSelector("#engine-status[data-state=ready]", { timeout: 60_000 });
    assert.match(await text(page, "#engine-status"), /Ready: tiny-ling on .* every expert on the GPU/);
    assert.match(await text(page, "#stat-ctx"), /^0 \/ \d+$/);
    await shot("loaded");

    // 5. a message, its reply streamed token by token (reasoning, thinking on), and the stats
    await page.evaluate(() => {
      window.tokenTrail = [];
      new MutationObserver(() => {
        const n = document.querySelector(".msg.assistant:last-of-type")?.dataset.tokens;
        if (n !== undefined && window.tokenTrail.at(-1) !== n) window.tokenTrail.push(n);
      }).observe(document.querySelector("#messages"), { subtree: true, attributes: true, attributeFilter: ["data-tokens"] });
    });
    await page.fill("#max-tokens", "5");
    await page.fill("#seed", "1");
    await page.fill("#input", "Hi");
    await page.click("#send");
    await page.waitForSelector(".msg.assistant[data-state=done]", { timeout: 90_000 });
    const trail = await page.evaluate(() => window.tokenTrail);
    assert.ok(trail.length >= 3 && trail.at(-1) === "5", `the reply arrived token by token: ${JSON.stringify(trail)}`);
    assert.equal(await page.locator(".msg.assistant .reasoning").isVisible(), true);
    assert.ok((await text(page, ".msg.assistant .reasoning-text")).length > 0, "reasoning text is shown");
    assert.match(await text(page, ".msg.assistant .meta"), /^5 tokens · [\d.]+ tok\/s · seed 1 · reached the token limit$/);
    assert.ok(Number(await page.locator("#stats").getAttribute("data-tokens-per-second")) > 0);
    assert.match(await text(page, "#stat-tps"), /^[\d.]+ tok\/s$/);
    assert.match(await text(page, "#stat-prompt"), /^\d+ tok · [\d.]+ tok\/s$/);
    assert.equal(await text(page, "#stat-hits"), "all resident");
    assert.match(await text(page, "#stat-read"), /^[\d.]+ k?B$/);
    assert.match(await text(page, "#stat-ctx"), /^[1-9]\d* \/ \d+$/);
    await shot("reply");

    // 6. a long reply: the page keeps handling input while it runs, then Stop ends it
    await page.fill("#max-tokens", "40");
    await page.fill("#input", "Tell me more");
    await page.press("#input", "Enter");
    await page.waitForFunction(() => Number(document.querySelector(".msg.assistant:last-of-type")?.dataset.tokens) >= 1, null, { timeout: 60_000 });
    const lag = await page.evaluate(async () => {
      let worst = 0, last = performance.now();
      for (let i = 0; i < 20; i++) {
        await new Promise((r) => setTimeout(r, 25));
        const now = performance.now();
        worst = Math.max(worst, now - last - 25);
        last = now;
      }
      return worst;
    });
    assert.ok(lag < 250, `the main thread stalled ${lag.toFixed(0)} ms during a generation`);
    const typedAt = Date.now();
    await page.locator("#input").pressSequentially("typed while it runs");
    assert.equal(await page.locator("#input").inputValue(), "typed while it runs");
    await page.click("#thinking");
    assert.equal(await page.locator("#thinking").isChecked(), false);
    await page.focus("#temperature");
    await page.keyboard.press("ArrowLeft");
    assert.equal(await text(page, "#temperature-value"), "0.75");
    const inputMs = Date.now() - typedAt;
    assert.equal(await page.locator("#chat").getAttribute("data-busy"), "generating", "the input was handled while the reply ran");
    console.log(`  while generating: worst timer lag ${lag.toFixed(0)} ms, typing + two settings changes in ${inputMs} ms`);
    await shot("typing-while-generating");
    await page.click("#stop");
    await page.waitForSelector(".msg.assistant:last-of-type[data-state=done]", { timeout: 30_000 });
    const stopped = page.locator(".msg.assistant").last();
    assert.equal(await stopped.getAttribute("data-finish"), "abort");
    assert.ok(Number(await stopped.getAttribute("data-tokens")) < 40);
    assert.match(await stopped.locator(".meta").innerText(), /stopped$/);
    assert.equal(await page.locator("#send").isDisabled(), false);
    assert.equal(await page.locator("#stop").isDisabled(), true);
    await shot("stopped");

    // 7. a new chat forgets the conversation
    await page.click("#new-chat");
    await page.waitForFunction(() => /^0 \//.test(document.querySelector("#stat-ctx").textContent));
    assert.equal(await page.locator(".msg").count(), 0);
    await shot("new-chat");

    // 8. a streaming expert pool: one too small is refused with the numbers; a 2 MiB one streams experts
    await page.click("#load-options summary");
    await page.selectOption("#pool-mode", "pool");
    await page.fill("#pool-mib", "0.25");
    await page.click("#reload-engine");
    await page.waitForSelector("#engine-status[data-state=failed]", { timeout: 60_000 });
    assert.equal(await text(page, "#notice-title"), "The expert pool is too small", fail(await text(page, "#notice")));
    assert.match(await text(page, "#notice-text"), /an expert pool of 262144 bytes holds \d+ expert records .* give at least \d+ bytes/);
    await shot("pool-too-small");
    await page.fill("#pool-mib", "2");
    await page.click("#reload-engine");
    await page.waitForSelector("#engine-status[data-state=ready]", { timeout: 60_000 });
    assert.match(await text(page, "#engine-status"), /experts stream into a 2\.10 MB pool \(hot\)/);
    assert.equal(await page.locator("#notice").isHidden(), true);
    await page.fill("#max-tokens", "3");
    await page.fill("#input", "Hello");
    await page.click("#send");
    await page.waitForSelector(".msg.assistant[data-state=done]", { timeout: 90_000 });
    assert.equal(await page.locator(".msg.assistant .reasoning").isVisible(), false, "thinking is off");
    assert.ok((await text(page, ".msg.assistant .answer")).length > 0);
    assert.match(await text(page, "#stat-hits"), /^\d+(\.\d)?% \(hot(:[\d.]+)?\)$/);
    assert.match(await text(page, "#stat-read"), /^[\d.]+ [kM]B$/);
    await shot("streaming-pool");

    // 9. the GPU process ends (every device lost): the page says so, and "Reload engine" loads from the store again
    await page.evaluate(() => chrome.gpuBenchmarking.terminateGpuProcessNormally());
    await page.waitForSelector("#notice:not([hidden])", { timeout: 30_000 });
    assert.equal(await text(page, "#notice-title"), "The GPU device was lost", fail(await text(page, "#notice")));
    assert.match(await text(page, "#notice-action"), /Reload engine/);
    await page.waitForSelector("#engine-status[data-state=failed]");
    assert.equal(await page.locator("#send").isDisabled(), true);
    await shot("device-lost");
    await page.waitForSelector("#gpu-status.ok", { timeout: 30_000 });
    await page.click("#reload-engine");
    await page.waitForSelector("#engine-status[data-state=ready]", { timeout: 60_000 });
    await page.fill("#max-tokens", "2");
    await page.fill("#input", "Hi again");
    await page.click("#send");
    await page.waitForSelector(".msg.assistant:last-of-type[data-state=done]", { timeout: 90_000 });
    assert.equal(await page.locator(".msg.assistant").last().getAttribute("data-finish"), "length");
    await shot("recovered");

    // 10. GGUF files the user already has: nothing downloaded, the files are copied into a store
    await page.check('input[name=source][value=files]');
    await page.setInputFiles("#files", [...PARTS].reverse().map((p) => path.join(modelDir, p)));
    await page.waitForSelector('#stores li[data-store="lingtab-tiny"][data-state=complete]', { timeout: 60_000 });
    assert.match(await text(page, "#ingest-text"), /lingtab-tiny: complete/);
    await shot("from-files");

    // 11. delete both stores (the loaded one unloads first)
    await storeCard(page, "lingtab-tiny").locator('button:text-is("Delete")').click();
    await page.waitForSelector('#stores li[data-store="lingtab-tiny"]', { state: "detached" });
    await storeCard(page, "tiny-ling").locator('button:text-is("Delete")').click();
    await page.waitForFunction(() => /No model stored yet/.test(document.querySelector("#stores").textContent));
    assert.equal(await page.locator("#send").isDisabled(), true);
    assert.equal(await page.locator("#reload-engine").isDisabled(), true);
    await shot("deleted");

    assert.deepEqual(errors, [], fail("uncaught errors on the page"));
  } finally {
    await browser.close();
  }
});
