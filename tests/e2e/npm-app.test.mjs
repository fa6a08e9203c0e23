// The npm package in a web app, in headless Chromium (WebGPU on SwiftShader): the app imports the packed and
// installed package (not the sources), loads the tiny model from a local server laid out like Hugging Face,
// and streams replies. Greedy tokens must equal `lingtab greedy` on the same prompt.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { launch } from "./chromium.mjs";

const lingtab = process.env.LINGTAB_BIN ?? "target/debug/lingtab";
const port = Number(process.env.LINGTAB_E2E_PORT ?? 18472);
const modelDir = process.env.LINGTAB_E2E_MODEL_DIR; // holds lingtab-tiny-0000{1,2}-of-00002.gguf
const appModules = process.env.LINGTAB_E2E_NODE_MODULES; // node_modules with the installed package

test("a web app streams a reply through the npm package", { timeout: 900_000 }, async () => {
  assert.ok(modelDir && appModules, "set LINGTAB_E2E_MODEL_DIR and LINGTAB_E2E_NODE_MODULES (see .ci/test)");
  const server = spawn(lingtab, ["serve", "--port", String(port), "--mount", "/=tests/e2e/app",
    "--mount", `/node_modules=${appModules}`, "--mount", `/hf/lingtab/tiny-ling/resolve/main=${modelDir}`], { stdio: "ignore" });
  const browser = await launch();
  try {
    const page = await browser.newPage();
    const logs = [];
    page.on("console", (m) => logs.push(m.text()));
    for (let i = 0; i < 50; i++) {
      try { await fetch(`http://127.0.0.1:${port}/index.html`); break; } catch { await new Promise((r) => setTimeout(r, 100)); }
    }
    await page.goto(`http://127.0.0.1:${port}/index.html?model=/hf/lingtab/tiny-ling/resolve/main/lingtab-tiny-00001-of-00002.gguf`);
    await page.waitForFunction(() => window.lingtabResults !== undefined, null, { timeout: 850_000 });
    const r = await page.evaluate(() => window.lingtabResults);
    assert.equal(r.error, undefined, `${r.error}\n${logs.join("\n")}`);

    assert.ok(r.progress.events > 2 && r.progress.last[1] === r.progress.last[2], `progress reached its total: ${JSON.stringify(r.progress)}`);
    // greedy through the JS API = lingtab greedy on the same prompt tokens
    const expected = JSON.parse(execFileSync(lingtab, ["greedy", "--gguf", `${modelDir}/lingtab-tiny-00001-of-00002.gguf`,
      "--tokens", r.promptTokens.join(","), "-n", "8"]).toString());
    assert.ok(r.greedy.tokens.length >= 1);
    assert.deepEqual(r.greedy.tokens, expected.slice(0, r.greedy.tokens.length));
    assert.ok(r.greedy.finish === "length" || r.greedy.finish === "stop", r.greedy.finish);
    if (r.greedy.finish === "length") assert.equal(r.greedy.tokens.length, 8);
    assert.equal(typeof r.greedy.text, "string");
    // a seeded sampled run is reproducible
    assert.deepEqual(r.seeded[0], r.seeded[1]);
    // an abort stops within one token and leaves the engine usable
    assert.equal(r.abort.finish, "abort");
    assert.ok(r.abort.tokens.length <= 3, `stopped after ${r.abort.tokens.length} tokens`);
    assert.match(r.twice, /already running/);
    assert.match(r.nan, /temperature/i);
    assert.match(r.noModel, /options\.model/);
    assert.ok(r.stats.generatedTokens >= 1 && r.stats.adapter.length > 0, JSON.stringify(r.stats));
    // the worker client gives the same greedy tokens
    assert.deepEqual(r.worker.tokens, r.greedy.tokens.slice(0, r.worker.tokens.length));
    assert.ok(r.worker.tokens.length >= 1 && r.workerStats.generatedTokens >= 1);
    // a store made by WorkerEngine.ingest gives the same greedy tokens, is listed, and is deleted
    assert.equal(r.ingest.state, "complete", JSON.stringify(r.ingest));
    assert.deepEqual(r.ingestPhases, ["headers", "fetch", "verify", "done"]);
    assert.equal(r.ingest.parts.length, 2);
    assert.deepEqual(r.storeGreedy.tokens, r.greedy.tokens.slice(0, r.storeGreedy.tokens.length));
    assert.ok(r.storeGreedy.tokens.length >= 1);
    // worker terminated mid-fetch three times: each run resumes from at least what the last one reported done
    // (no finished unit is fetched again), and the store ends byte-identical to the uninterrupted one
    const k = r.killed;
    assert.equal(k.state, "complete");
    for (let i = 1; i < k.resumes.length; i++) {
      assert.ok(k.resumes[i].first >= k.resumes[i - 1].last && k.resumes[i].first > 0, `resume ${i}: ${JSON.stringify(k.resumes)}`);
    }
    assert.deepEqual(k.same, { "data.bin": true, "manifest.json": true, manifestSha: true }, JSON.stringify(k));
    // two workers (as two tabs) on one store: one ingest at a time, none under an engine, no delete under one
    const t = r.twoTabs;
    assert.match(t.secondIngest, /refused: .*being downloaded or deleted in this or another tab/, JSON.stringify(t));
    assert.match(t.loadDuringIngest, /refused: .*being downloaded or deleted in this or another tab/, JSON.stringify(t));
    assert.equal(t.firstStillRunning, true, "the first ingest ended before the others were refused");
    assert.equal(t.first, "complete", JSON.stringify(t));
    assert.match(t.ingestUnderEngine, /refused: .*in use by an engine loaded from it/, JSON.stringify(t));
    assert.match(t.deleteUnderEngine, /refused: .*in use by an engine loaded from it/, JSON.stringify(t));
    assert.equal(t.engineAfter, true);
    assert.equal(t.deleteAfter, true);
    assert.equal(r.listed?.state, "complete");
    assert.equal(r.deleted, true);
    assert.equal(r.afterDelete, null);
    console.log(`npm app: greedy ${JSON.stringify(r.greedy.tokens)} (${r.greedy.finish}), ${JSON.stringify(r.stats)}`);
  } finally {
    await browser.close();
    server.kill();
  }
});
