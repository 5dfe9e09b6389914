// Drives the demo page in headless Chromium (run by web/test.sh, which builds the page, serves it
// and computes the expected tokens natively). Every check goes through the page's own controls:
// the file input, the URL form, the chat box, the stop button. Exits non-zero on any failure.
//
// Environment: BASE_URL (the served page), EXPECTED (JSON: {"prompt", "models": [{"path",
// "tokens"}], "url": {"href", "tokens"}, "synth": {"path", "prompt", "tokens"}}: chat turns for
// the models and the URL, a plain prompt for the synth), OUT (where the screenshot and
// results.json go), CHROMIUM (the browser binary).
import { chromium } from 'playwright-core';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, statSync, truncateSync, writeSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';

const env = (k, d) => process.env[k] ?? d;
const base = env('BASE_URL');
const expected = JSON.parse(readFileSync(env('EXPECTED'), 'utf8'));
const out = env('OUT');
const chromiumPath = env('CHROMIUM', '/usr/bin/chromium');
const MIB = 1 << 20;

const results = { checks: [] };
let failed = 0;
const log = (...a) => console.log('[web-test]', ...a);
function check(name, ok, detail = '') {
  results.checks.push({ name, ok, detail });
  log(`${ok ? 'ok  ' : 'FAIL'} ${name}${detail ? `: ${detail}` : ''}`);
  if (!ok) failed++;
}

const args = [
  '--no-sandbox',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

async function launch(extraArgs) {
  const dir = mkdtempSync(join(tmpdir(), 'rill-chromium-'));
  const ctx = await chromium.launchPersistentContext(dir, {
    executablePath: chromiumPath,
    headless: true,
    args: [...args, ...extraArgs],
    viewport: { width: 1280, height: 900 },
  });
  const page = ctx.pages()[0] ?? (await ctx.newPage());
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'warning') log(`[console.${m.type()}]`, m.text());
  });
  page.on('pageerror', (e) => log('[pageerror]', e.message));
  return { page, close: async () => { await ctx.close(); rmSync(dir, { recursive: true, force: true }); } };
}

const state = (page) => page.evaluate(() => {
  const d = window.rillDemo;
  return { ready: d.ready, busy: d.busy, loaded: d.loaded, lastRun: d.lastRun, errors: d.errors, wasmPeakBytes: d.wasmPeakBytes };
});

// Wait until the page is idle with a model named `name` loaded (or an error arrived).
async function waitLoaded(page, name, errorsBefore, timeout) {
  await page.waitForFunction(
    ([n, e]) => {
      const d = window.rillDemo;
      return (!d.busy && d.loaded && d.loaded.name === n) || d.errors.length > e;
    },
    [name, errorsBefore],
    { timeout, polling: 250 },
  );
  const s = await state(page);
  if (s.errors.length > errorsBefore) throw new Error(`loading ${name} failed: ${s.errors.at(-1)}`);
  return s;
}

async function loadFile(page, path, timeout = 120_000) {
  const before = (await state(page)).errors.length;
  const t0 = Date.now();
  await page.setInputFiles('#file', path);
  const s = await waitLoaded(page, basename(path), before, timeout);
  log(`loaded ${basename(path)} in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  return s;
}

async function setSettings(page, { temperature, maxTokens, chat = true, thinking = false, seed = 0 }) {
  await page.fill('#temperature', String(temperature));
  await page.fill('#max-tokens', String(maxTokens));
  await page.fill('#seed', String(seed));
  await page.setChecked('#chat-template', chat);
  await page.setChecked('#thinking', thinking);
}

// Start a chat turn through the prompt box and the Send button.
async function startTurn(page, prompt) {
  await page.fill('#prompt', prompt);
  await page.click('#send');
  await page.waitForFunction(() => window.rillDemo.busy, null, { timeout: 10_000 });
}

async function finishTurn(page, timeout) {
  const before = (await state(page)).errors.length;
  await page.waitForFunction((e) => !window.rillDemo.busy || window.rillDemo.errors.length > e, before, {
    timeout,
    polling: 100,
  });
  const s = await state(page);
  if (s.errors.length > before) throw new Error(`generation failed: ${s.errors.at(-1)}`);
  return s.lastRun;
}

// A fresh chat (New chat), then one greedy turn of `n` tokens (`chat` false: a plain prompt).
async function greedyTurn(page, prompt, n, { chat = true, timeout = 120_000 } = {}) {
  await page.click('#reset');
  await setSettings(page, { temperature: 0, maxTokens: n, chat });
  await startTurn(page, prompt);
  return finishTurn(page, timeout);
}

const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

// A GGUF v3 header with one F32 tensor of `bytes` bytes, written as a sparse file of the full
// length (only the header takes disk space; the page reads only the header before refusing).
function writeHugeGguf(path, bytes) {
  const parts = [];
  const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); parts.push(b); };
  const u64 = (v) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); parts.push(b); };
  const str = (s) => { u64(Buffer.byteLength(s)); parts.push(Buffer.from(s)); };
  parts.push(Buffer.from('GGUF'));
  u32(3); // version
  u64(1); // tensors
  u64(1); // metadata entries
  str('general.architecture');
  u32(8); // string
  str('qwen35');
  const cols = 1024;
  str('token_embd.weight');
  u32(2); // dims
  u64(cols);
  u64(bytes / 4 / cols);
  u32(0); // F32
  u64(0); // offset in the data section
  let header = Buffer.concat(parts);
  header = Buffer.concat([header, Buffer.alloc((32 - (header.length % 32)) % 32)]);
  const fd = openSync(path, 'w');
  writeSync(fd, header);
  closeSync(fd);
  truncateSync(path, header.length + bytes);
}

// Load `path` through the file input and wait for the page's error; returns the notice's text.
async function loadFailure(page, path) {
  const before = (await state(page)).errors.length;
  await page.setInputFiles('#file', path);
  await page.waitForFunction((e) => window.rillDemo.errors.length > e && !window.rillDemo.busy, before, {
    timeout: 60_000,
  });
  const visible = await page.isVisible('#notice');
  return visible ? (await page.textContent('#notice')).trim() : '(no message shown)';
}

async function main() {
  // ---- without --enable-unsafe-webgpu Chromium offers no adapter: the page must say so ----
  {
    const { page, close } = await launch([]);
    await page.goto(base);
    await page.waitForSelector('#notice:not([hidden])', { timeout: 60_000 });
    const text = await page.textContent('#notice');
    check('a browser without a WebGPU adapter gets a clear message', /WebGPU/.test(text), text.trim());
    await close();
  }

  const { page, close } = await launch(['--enable-unsafe-webgpu']);
  try {
    await page.goto(base);
    await page.waitForFunction(() => window.rillDemo.ready || !document.getElementById('notice').hidden, null, {
      timeout: 60_000,
    });
    const ready = (await state(page)).ready;
    check('the engine starts on WebGPU', ready, ready ? '' : await page.textContent('#notice'));
    if (!ready) return;
    const device = JSON.parse(await page.textContent('#device-info'));
    results.device = device;
    log('device:', JSON.stringify(device));


    // ---- files the page must refuse with a message that says why ----
    {
      const notGguf = join(out, 'not-a-model.gguf');
      writeFileSync(notGguf, 'this is a text file, not a model\n'.repeat(100));
      let text = await loadFailure(page, notGguf);
      check('a file that is not GGUF is refused with a clear message', /not a GGUF file/.test(text), text);

      const model = readFileSync(expected.models[0].path);
      const cut = join(out, 'truncated.gguf');
      writeFileSync(cut, model.subarray(0, Math.floor(model.length * 0.9)));
      text = await loadFailure(page, cut);
      check('a truncated model is refused with a clear message', /truncated|beyond|past the end|end of the file/i.test(text), text);

      // Larger than this adapter allows in one buffer: refused from the header, naming the limit,
      // before any tensor byte is read. (A tensor larger than one storage binding but not than
      // a buffer is bound in pieces, so only maxBufferSize refuses it.)
      const limit = device.limits.maxBufferSize;
      const huge = join(out, 'too-large.gguf');
      const bytes = (Math.floor(limit / 4096) + 1) * 4096;
      writeHugeGguf(huge, bytes);
      text = await loadFailure(page, huge);
      rmSync(huge, { force: true });
      check(
        'a model too large for the adapter is refused, naming the limit',
        /too large/.test(text) && /max(Storage)?Buffer(Binding)?Size/.test(text) && /token_embd\.weight/.test(text),
        text,
      );
    }

    // ---- the tiny fixtures through the file input: greedy tokens equal the native CPU's ----
    for (const m of expected.models) {
      await loadFile(page, m.path);
      const run = await greedyTurn(page, expected.prompt, m.tokens.length);
      check(
        `${basename(m.path)}: ${m.tokens.length} greedy tokens equal the native CPU backend's`,
        same(run.tokens, m.tokens),
        same(run.tokens, m.tokens) ? `${run.genPerSecond.toFixed(1)} tokens/s` : `page ${JSON.stringify(run.tokens)} cpu ${JSON.stringify(m.tokens)}`,
      );
    }

    // ---- the page shows the text and the speed: screenshot ----
    {
      const last = expected.models.at(-1);
      const run = (await state(page)).lastRun;
      const bubble = await page.locator('.msg.assistant').last().innerText();
      const stats = await page.textContent('#stats');
      check('the page shows the generated text', run.text.length > 0 && bubble.trim() === run.text.trim(), JSON.stringify(bubble.slice(0, 60)));
      check('the page shows tokens/s', /generation: \d+ tokens, \d+\.\d tokens\/s/.test(stats), stats);
      await page.screenshot({ path: join(out, 'demo.png'), fullPage: true });
      log(`screenshot of ${basename(last.path)}: ${join(out, 'demo.png')}`);
    }

    // ---- the stop button ends a long generation ----
    {
      const max = 3000;
      await page.click('#reset');
      await setSettings(page, { temperature: 0, maxTokens: max });
      await startTurn(page, expected.prompt);
      await page.waitForFunction(() => document.querySelectorAll('.msg.assistant').length && !document.getElementById('stop').disabled);
      // Let it stream a little, then press Stop.
      await page.waitForFunction(() => window.rillDemo.busy === false || document.querySelector('.msg.assistant:last-child').textContent.length > 20, null, { timeout: 60_000 });
      const t0 = Date.now();
      await page.click('#stop');
      const run = await finishTurn(page, 30_000);
      check(
        'Stop ends a long generation',
        run.finish === 'stopped' && run.tokens.length < max,
        `${run.tokens.length} of ${max} tokens, finish ${run.finish}, ${Date.now() - t0} ms after the click`,
      );
    }

    // ---- a URL download kept in OPFS, then loaded again from there ----
    if (expected.url) {
      const name = basename(new URL(expected.url.href).pathname);
      const before = (await state(page)).errors.length;
      await page.fill('#url', expected.url.href);
      await page.setChecked('#cache', true);
      await page.click('#download');
      await waitLoaded(page, name, before, 60_000);
      let run = await greedyTurn(page, expected.prompt, expected.url.tokens.length);
      check('a model downloaded from a URL gives the same tokens', same(run.tokens, expected.url.tokens));
      const entry = page.locator('#cached-list li', { hasText: name });
      check('the download is kept in the Origin Private File System', (await entry.count()) === 1);
      await entry.getByRole('button', { name: 'Load' }).click();
      await waitLoaded(page, name, before, 60_000);
      run = await greedyTurn(page, expected.prompt, expected.url.tokens.length);
      check('the kept copy loads and gives the same tokens', same(run.tokens, expected.url.tokens));
    }

    // ---- a real-shaped model: streamed, so the wasm heap stays far below the file ----
    // A plain one-token prompt: on a software adapter every step of this model takes minutes.
    if (expected.synth) {
      const { path, prompt, tokens } = expected.synth;
      const size = statSync(path).size;
      const t0 = Date.now();
      const s = await loadFile(page, path, 600_000);
      const loadSeconds = (Date.now() - t0) / 1000;
      const t1 = Date.now();
      const run = await greedyTurn(page, prompt, tokens.length, { chat: false, timeout: 3_600_000 });
      const generateSeconds = (Date.now() - t1) / 1000;
      const peak = (await state(page)).wasmPeakBytes;
      results.synth = {
        file: basename(path),
        fileBytes: size,
        loadSeconds,
        generateSeconds,
        tokens: run.tokens,
        wasmPeakBytes: peak,
        info: s.loaded.info,
      };
      log(`${basename(path)}: ${(size / MIB).toFixed(0)} MiB file loaded in ${loadSeconds.toFixed(1)} s, ` +
        `wasm heap peak ${(peak / MIB).toFixed(1)} MiB; ${run.tokens.length} tokens in ${generateSeconds.toFixed(0)} s`);
      check(`${basename(path)}: ${tokens.length} greedy tokens equal the native CPU backend's`, same(run.tokens, tokens),
        `page ${JSON.stringify(run.tokens)} cpu ${JSON.stringify(tokens)}`);
      // Streaming keeps one 8 MiB piece, the header and the tokenizer in wasm memory.
      check('the wasm heap peak stays far below the file size (under a quarter)', peak < size / 4,
        `${(peak / MIB).toFixed(1)} MiB for a ${(size / MIB).toFixed(0)} MiB file`);
    }
  } finally {
    await close();
  }
}

try {
  await main();
} catch (e) {
  check('the browser test ran to the end', false, e.stack || String(e));
}
writeFileSync(join(out, 'results.json'), JSON.stringify(results, null, 2));
log(failed ? `${failed} check(s) failed` : 'all checks passed');
process.exit(failed ? 1 : 0);
