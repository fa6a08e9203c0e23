// One reader of a store file for lingtab's engine (started from a Blob URL by src/store/opfs_readers.rs; no
// wasm here). It holds its own read-only sync access handle on the file, so several readers read at once.
// In:  {id, open: {folder, store, file}} once, then {id, at, len} per read, and {recycle: buffer} to hand a
//      buffer back once its bytes are copied out.
// Out: {id, size} | {id, unsupported: true} (no read-only handles here) | {id, buffer} (the ArrayBuffer is
//      transferred, not copied; the bytes are its first `len`) | {id, error, name}.
let handle = null;
// buffers handed back, reused for later reads: a fresh one costs an allocation and a page fault per 4 KiB
const spare = [];
const MAX_SPARE = 4;

function bufferFor(len) {
  let best = -1;
  for (let i = 0; i < spare.length; i++) {
    if (spare[i].byteLength >= len && (best < 0 || spare[i].byteLength < spare[best].byteLength)) best = i;
  }
  if (best >= 0) return spare.splice(best, 1)[0];
  return new ArrayBuffer(len);
}

const failure = (id, e) => self.postMessage({ id, error: e?.message ?? String(e), name: e?.name ?? "Error" });
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function open({ folder, store, file }) {
  const root = await navigator.storage.getDirectory();
  const dir = await (await root.getDirectoryHandle(folder)).getDirectoryHandle(store);
  const fileHandle = await dir.getFileHandle(file);
  // a browser that knows `mode` reads it from the options; one that does not would hand out an exclusive
  // readwrite handle, which would lock out the other readers (and every other tab)
  let modeKnown = false;
  const options = { get mode() { modeKnown = true; return "read-only"; } };
  // a reader terminated a moment ago (or a writer that is closing) lets go of the file shortly
  for (let attempt = 0; ; attempt++) {
    try {
      handle = await fileHandle.createSyncAccessHandle(options);
      break;
    } catch (e) {
      if (e?.name !== "NoModificationAllowedError" || attempt === 10) throw e;
      await sleep(100);
    }
  }
  if (!modeKnown) {
    handle.close();
    handle = null;
    return { unsupported: true };
  }
  return { size: handle.getSize() };
}

self.onmessage = async ({ data }) => {
  const { id } = data;
  if (data.recycle) {
    spare.push(data.recycle);
    // keep the largest few
    if (spare.length > MAX_SPARE) spare.sort((a, b) => b.byteLength - a.byteLength).pop();
    return;
  }
  try {
    if (data.open) return self.postMessage({ id, ...(await open(data.open)) });
    if (!handle) throw new Error("the reader has no open file");
    const buffer = bufferFor(data.len);
    const n = handle.read(new Uint8Array(buffer, 0, data.len), { at: data.at });
    if (n !== data.len) throw new RangeError(`the file ends after ${n} of them`);
    self.postMessage({ id, buffer }, [buffer]);
  } catch (e) {
    failure(id, e);
  }
};
