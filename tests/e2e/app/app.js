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
} catch (e) {
  results.error = String(e?.stack ?? e);
}
window.lingtabResults = results;
