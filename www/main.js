// The page: finds the WebGPU adapter and reads a model's GGUF header over HTTP Range requests.
import init, { adapterInfo, inspectModel } from "./pkg/lingtab.js";

const HF_FLASH = "https://huggingface.co/inclusionAI/Ling-3.0-flash-GGUF/resolve/"
  + "29edce5130491e638f3e5ebec91fa0a5ed4f780e/Q4_K_M/Ling-3.0-flash-Q4_K_M-00001-of-00002.gguf";
const LOCAL_TINY = new URL("hf/lingtab/tiny-ling/resolve/main/lingtab-tiny-00001-of-00002.gguf", location.href).href;

const $ = (id) => document.getElementById(id);

function status(el, text, kind = "") {
  el.textContent = text;
  el.className = `status ${kind}`;
}

function fillTable(table, rows) {
  table.replaceChildren(...rows.map(([k, v]) => {
    const tr = document.createElement("tr");
    const a = document.createElement("td");
    const b = document.createElement("td");
    a.textContent = k;
    b.textContent = typeof v === "object" ? JSON.stringify(v) : String(v);
    if (typeof v === "number") b.className = "num";
    tr.append(a, b);
    return tr;
  }));
}

const bytes = (n) => {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 2 : 0)} ${units[i]}`;
};

async function showAdapter() {
  if (!("gpu" in navigator)) {
    status($("gpu-status"), "This browser has no WebGPU. Use Chrome or Edge 113 or newer on a machine with a supported GPU.", "error");
    return;
  }
  try {
    const a = await adapterInfo();
    status($("gpu-status"), `Adapter: ${a.name || "(unnamed)"} — ${a.device_type}`, "ok");
    fillTable($("gpu-limits"), [
      ["maxBufferSize", bytes(a.max_buffer_size)],
      ["maxStorageBufferBindingSize", bytes(a.max_storage_buffer_binding_size)],
      ["maxStorageBuffersPerShaderStage", a.max_storage_buffers_per_shader_stage],
      ["maxComputeWorkgroupsPerDimension", a.max_compute_workgroups_per_dimension],
      ["maxComputeInvocationsPerWorkgroup", a.max_compute_invocations_per_workgroup],
      ["features", a.features.join(", ") || "(none)"],
    ]);
    $("gpu-limits").hidden = false;
  } catch (e) {
    status($("gpu-status"), `WebGPU is not usable here: ${e.message}`, "error");
  }
}

async function readHeader(url) {
  status($("model-status"), "Reading the header over HTTP Range requests…");
  $("model-info").hidden = true;
  try {
    const m = await inspectModel(url);
    const t = m.totals;
    status($("model-status"), `${m.arch}: ${m.metadata["general.name"] ?? ""} — ${m.parts.length} part(s), ${t.tensors} tensors`, "ok");
    fillTable($("model-totals"), [
      ["file size", bytes(t.file_bytes)],
      ["dense weights (GPU)", bytes(t.dense_bytes)],
      ["routed experts (disk)", bytes(t.expert_bytes)],
      ["MTP block (unused)", bytes(t.mtp_bytes)],
      ["expert record (largest)", bytes(Math.max(...t.expert_record_bytes.map((r) => r.bytes)))],
      ...m.parts.map((p) => [`part ${p.part}`, `${bytes(p.bytes)}, ${p.tensors} tensors`]),
    ]);
    fillTable($("model-config"), Object.entries(m.config));
    $("model-info").hidden = false;
  } catch (e) {
    status($("model-status"), e.message, "error");
  }
}

function chooseModel() {
  const choice = $("model-choice").value;
  $("model-url").value = choice === "hf" ? HF_FLASH : choice === "local" ? LOCAL_TINY : "";
  $("model-url").readOnly = choice !== "custom";
}

await init();
$("model-choice").addEventListener("change", chooseModel);
$("model-form").addEventListener("submit", (e) => {
  e.preventDefault();
  readHeader($("model-url").value);
});
chooseModel();
showAdapter();
readHeader($("model-url").value);
