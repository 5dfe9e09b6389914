// The engine's thread: loads rill's wasm build (web/pkg, from web/build.sh), opens the WebGPU
// device and runs every load and generation, so the page stays responsive. It talks to the page
// (app.js) with messages; every message it sends has a `type`.
import init, { Engine } from './pkg/rill.js';

let engine = null;

const post = (msg) => self.postMessage(msg);
const wasmBytes = () => Engine.wasm_memory_bytes();
const errorText = (e) => (e && e.message) || String(e);

// ---- models from a URL, optionally kept in the Origin Private File System ----

// A file name for the OPFS cache from the model URL's last path segment.
function cacheName(url) {
  const last = new URL(url, self.location.href).pathname.split('/').pop() || 'model.gguf';
  return decodeURIComponent(last).replace(/[^A-Za-z0-9._-]/g, '_');
}

async function cacheDir() {
  if (!navigator.storage || !navigator.storage.getDirectory) return null;
  try {
    return await navigator.storage.getDirectory();
  } catch {
    return null;
  }
}

async function listCached() {
  const dir = await cacheDir();
  const files = [];
  if (dir) {
    for await (const [name, handle] of dir.entries()) {
      if (handle.kind !== 'file' || name.endsWith('.part')) continue;
      files.push({ name, size: (await handle.getFile()).size });
    }
  }
  files.sort((a, b) => a.name.localeCompare(b.name));
  post({ type: 'cached', files, available: dir !== null });
}

// Stream the response body into `sink(chunk)`, reporting progress.
async function pump(response, sink) {
  const total = Number(response.headers.get('content-length')) || 0;
  const reader = response.body.getReader();
  let done = 0;
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    await sink(value);
    done += value.byteLength;
    post({ type: 'progress', phase: 'download', done, total });
  }
}

// Download `url` into a Blob-like object without holding it in wasm memory: into an OPFS file
// when caching (the file is written as NAME.part and renamed when complete), else into a Blob
// (which the browser may keep on disk).
async function download(url, useCache) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`download failed: HTTP ${response.status} for ${url}`);
  const dir = useCache ? await cacheDir() : null;
  if (!dir) {
    const parts = [];
    await pump(response, (chunk) => parts.push(chunk));
    return new Blob(parts);
  }
  const name = cacheName(url);
  const part = await dir.getFileHandle(`${name}.part`, { create: true });
  const writable = await part.createWritable();
  try {
    await pump(response, (chunk) => writable.write(chunk));
    await writable.close();
  } catch (e) {
    await writable.abort().catch(() => {});
    await dir.removeEntry(`${name}.part`).catch(() => {});
    throw e;
  }
  await dir.removeEntry(name).catch(() => {});
  await part.move(name);
  await listCached();
  return (await dir.getFileHandle(name)).getFile();
}

async function cachedFile(name) {
  const dir = await cacheDir();
  if (!dir) throw new Error('this browser has no Origin Private File System');
  return (await dir.getFileHandle(name)).getFile();
}

// ---- the engine ----

async function load(blob, name, nCtx) {
  const t0 = performance.now();
  const info = JSON.parse(
    await engine.load(blob, nCtx || 0, (done, total) => post({ type: 'progress', phase: 'load', done, total })),
  );
  post({ type: 'loaded', name, info, seconds: (performance.now() - t0) / 1000, wasmBytes: wasmBytes() });
}

async function generate(msg) {
  const s = msg.sampling;
  engine.set_sampling(s.temperature, s.topK, s.topP, s.minP, s.repeatPenalty, s.seed);
  const prompt =
    msg.text !== undefined ? engine.tokenize(msg.text, false) : engine.chat_tokens(JSON.stringify(msg.messages), msg.thinking);
  const tokens = [];
  const t0 = performance.now();
  let tFirst = 0;
  let tLast = 0;
  const result = JSON.parse(
    await engine.generate(prompt, msg.maxTokens, (id, text) => {
      const now = performance.now();
      if (id !== null && id !== undefined) {
        tokens.push(id);
        if (tokens.length === 1) tFirst = now;
        tLast = now;
      }
      post({ type: 'token', id, text });
    }),
  );
  const promptMs = tFirst - t0;
  const genMs = tLast - tFirst;
  post({
    type: 'done',
    tokens,
    finish: result.finish,
    promptTokens: result.prompt,
    // The first token comes out of the prompt's step; the speed counts the tokens after it.
    promptPerSecond: promptMs > 0 ? (1000 * result.prompt) / promptMs : 0,
    genPerSecond: tokens.length > 1 && genMs > 0 ? (1000 * (tokens.length - 1)) / genMs : 0,
    wasmBytes: wasmBytes(),
  });
}

const handlers = {
  async 'load-file'(msg) {
    await load(msg.file, msg.file.name, msg.nCtx);
  },
  async 'load-url'(msg) {
    const blob = await download(msg.url, msg.cache);
    await load(blob, cacheName(msg.url), msg.nCtx);
  },
  async 'load-cached'(msg) {
    await load(await cachedFile(msg.name), msg.name, msg.nCtx);
  },
  async 'delete-cached'(msg) {
    const dir = await cacheDir();
    if (dir) await dir.removeEntry(msg.name);
    await listCached();
  },
  async generate(msg) {
    await generate(msg);
  },
  // Runs while a generation is suspended on the device: it ends after its current token.
  stop() {
    engine.stop();
  },
  reset() {
    engine.reset();
    post({ type: 'reset' });
  },
};

self.onmessage = async (event) => {
  const msg = event.data;
  try {
    if (!engine) throw new Error('the engine is not ready');
    await handlers[msg.type](msg);
  } catch (e) {
    post({ type: 'error', during: msg.type, message: errorText(e), wasmBytes: engine ? wasmBytes() : 0 });
  }
};

(async () => {
  try {
    await init();
    if (!navigator.gpu) {
      post({ type: 'fatal', noWebGPU: true, message: 'this browser exposes no WebGPU to workers (navigator.gpu is missing)' });
      return;
    }
    engine = await Engine.create();
    post({ type: 'ready', device: JSON.parse(engine.device_info()), wasmBytes: wasmBytes() });
    await listCached();
  } catch (e) {
    post({ type: 'fatal', message: errorText(e) });
  }
})();
