// The page: model source, chat, sampling settings. The engine runs in worker.js; this file only
// renders what the worker reports. `window.rillDemo` exposes the state for web/test.mjs.
const $ = (id) => document.getElementById(id);

const demo = {
  ready: false,
  loaded: null, // {name, info} of the loaded model
  loading: '', // the name of the model being loaded (for error messages)
  busy: false, // a load or a generation is running
  messages: [], // the conversation, [{role, content}]
  lastRun: null, // {tokens, text, finish, promptPerSecond, genPerSecond}
  wasmPeakBytes: 0,
  errors: [],
};
window.rillDemo = demo;

const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
const send = (msg) => worker.postMessage(msg);

function notice(text, kind = 'error') {
  const el = $('notice');
  el.textContent = text;
  el.className = `notice ${kind}`;
  el.hidden = !text;
}

function mib(bytes) {
  return `${(bytes / (1 << 20)).toFixed(1)} MiB`;
}

function setBusy(busy, generating = false) {
  demo.busy = busy;
  const canLoad = demo.ready && !busy;
  $('file').disabled = !canLoad;
  $('download').disabled = !canLoad;
  document.querySelectorAll('#cached-list button').forEach((b) => (b.disabled = !canLoad));
  $('send').disabled = !demo.loaded || busy;
  $('reset').disabled = !demo.loaded || busy;
  $('stop').disabled = !generating;
}

function progress(phase, done, total) {
  const bar = $('progress');
  bar.hidden = false;
  bar.max = total || 1;
  bar.value = total ? done : 0;
  const what = phase === 'download' ? 'downloading' : 'loading to the GPU';
  const pct = total ? ` (${((100 * done) / total).toFixed(0)}%)` : '';
  $('progress-text').textContent = `${what}: ${mib(done)}${total ? ` of ${mib(total)}` : ''}${pct}`;
}

function noteWasm(bytes) {
  demo.wasmPeakBytes = Math.max(demo.wasmPeakBytes, bytes || 0);
}

// ---- chat rendering ----

function addBubble(role, text) {
  const div = document.createElement('div');
  div.className = `msg ${role}`;
  const think = document.createElement('span');
  think.className = 'think';
  const answer = document.createElement('span');
  answer.className = 'answer';
  answer.textContent = text || '';
  div.append(think, answer);
  $('messages').append(div);
  div.scrollIntoView({ block: 'end' });
  return { div, think, answer };
}

let current = null; // the assistant bubble being streamed: {bubble, text, thinking}

function appendToken(text) {
  if (!current || !text) return;
  current.text += text;
  const b = current.bubble;
  if (current.thinking) {
    // Reasoning (before `</think>`) is shown dimmed, the answer after it plainly.
    const cut = current.text.indexOf('</think>');
    b.think.textContent = cut < 0 ? current.text : current.text.slice(0, cut);
    b.answer.textContent = cut < 0 ? '' : current.text.slice(cut + '</think>'.length).replace(/^\n+/, '');
  } else {
    b.answer.textContent = current.text;
  }
  b.div.scrollIntoView({ block: 'end' });
}

// ---- controls ----

function sampling() {
  const num = (id) => Number($(id).value);
  return {
    temperature: num('temperature'),
    topK: num('top-k'),
    topP: num('top-p'),
    minP: num('min-p'),
    repeatPenalty: num('repeat-penalty'),
    seed: num('seed'),
  };
}

function nCtx() {
  return Number($('n-ctx').value) || 0;
}

$('file').addEventListener('change', () => {
  const file = $('file').files[0];
  if (!file) return;
  startLoad(file.name);
  send({ type: 'load-file', file, nCtx: nCtx() });
});

$('url-form').addEventListener('submit', (e) => {
  e.preventDefault();
  const url = $('url').value.trim();
  if (!url) return;
  startLoad(url);
  send({ type: 'load-url', url, cache: $('cache').checked, nCtx: nCtx() });
});

function startLoad(name) {
  notice('');
  demo.loading = name;
  demo.loaded = null;
  $('model-info').textContent = `Loading ${name}…`;
  progress('load', 0, 0);
  setBusy(true);
}

$('prompt-form').addEventListener('submit', (e) => {
  e.preventDefault();
  const text = $('prompt').value.trim();
  if (!text || demo.busy || !demo.loaded) return;
  $('prompt').value = '';
  notice('');
  const chat = $('chat-template').checked;
  const thinking = chat && $('thinking').checked;
  if (chat) demo.messages.push({ role: 'user', content: text });
  addBubble('user', text);
  current = { bubble: addBubble('assistant', ''), text: '', thinking, chat };
  $('stats').textContent = 'generating…';
  setBusy(true, true);
  send({
    type: 'generate',
    // A plain prompt is continued as it is; a chat turn sends the whole conversation.
    ...(chat ? { messages: demo.messages } : { text }),
    thinking,
    maxTokens: Number($('max-tokens').value) || 1,
    sampling: sampling(),
  });
});

$('prompt').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault();
    $('prompt-form').requestSubmit();
  }
});

$('stop').addEventListener('click', () => {
  send({ type: 'stop' });
  $('stop').disabled = true;
});

$('reset').addEventListener('click', () => {
  demo.messages = [];
  $('messages').replaceChildren();
  $('stats').textContent = '';
  send({ type: 'reset' });
});

function showCached(files, available) {
  $('cached').hidden = !available || files.length === 0;
  $('cache').disabled = !available;
  if (!available) $('cache').checked = false;
  const list = $('cached-list');
  list.replaceChildren();
  for (const f of files) {
    const li = document.createElement('li');
    li.textContent = `${f.name} (${mib(f.size)}) `;
    const load = document.createElement('button');
    load.textContent = 'Load';
    load.addEventListener('click', () => {
      startLoad(f.name);
      send({ type: 'load-cached', name: f.name, nCtx: nCtx() });
    });
    const del = document.createElement('button');
    del.textContent = 'Delete';
    del.addEventListener('click', () => send({ type: 'delete-cached', name: f.name }));
    li.append(load, del);
    list.append(li);
  }
  setBusy(demo.busy, !$('stop').disabled);
}

// ---- what the worker reports ----

const on = {
  ready(m) {
    demo.ready = true;
    noteWasm(m.wasmBytes);
    $('device-info').textContent = JSON.stringify(m.device, null, 2);
    setBusy(false);
  },
  fatal(m) {
    $('device-info').textContent = m.message;
    notice(
      m.noWebGPU
        ? `This browser has no WebGPU (${m.message}). Use a recent Chrome, Edge or Firefox with WebGPU enabled.`
        : `WebGPU could not start: ${m.message}`,
    );
  },
  cached(m) {
    showCached(m.files, m.available);
  },
  progress(m) {
    progress(m.phase, m.done, m.total);
  },
  loaded(m) {
    noteWasm(m.wasmBytes);
    demo.loaded = { name: m.name, info: m.info };
    demo.messages = [];
    $('messages').replaceChildren();
    $('progress').hidden = true;
    $('progress-text').textContent = '';
    const i = m.info;
    $('model-info').textContent =
      `${m.name}: ${i.arch}, ${i.layers} layers, ${mib(i.tensorBytes)} of weights, context ${i.context}; ` +
      `loaded in ${m.seconds.toFixed(1)} s`;
    setBusy(false);
  },
  token(m) {
    appendToken(m.text);
  },
  done(m) {
    noteWasm(m.wasmBytes);
    const text = current ? current.text : '';
    if (current && current.chat) demo.messages.push({ role: 'assistant', content: text });
    demo.lastRun = {
      tokens: m.tokens,
      text,
      finish: m.finish,
      promptPerSecond: m.promptPerSecond,
      genPerSecond: m.genPerSecond,
    };
    const why = { eog: 'end of answer', length: 'max tokens', stopped: 'stopped' }[m.finish] || m.finish;
    $('stats').textContent =
      `prompt: ${m.promptTokens} tokens, ${m.promptPerSecond.toFixed(1)} tokens/s · ` +
      `generation: ${m.tokens.length} tokens, ${m.genPerSecond.toFixed(1)} tokens/s (${why})`;
    current = null;
    setBusy(false);
  },
  reset() {},
  error(m) {
    noteWasm(m.wasmBytes);
    demo.errors.push(m.message);
    notice(m.during.startsWith('load') ? `Could not load ${demo.loading}: ${m.message}` : m.message);
    if (m.during === 'generate') {
      // The turn failed: drop its user message so the conversation stays consistent.
      if (current && current.chat) demo.messages.pop();
      current = null;
      $('stats').textContent = '';
    }
    if (m.during.startsWith('load')) {
      $('progress').hidden = true;
      $('model-info').textContent = 'No model loaded.';
    }
    setBusy(false);
  },
};

worker.onmessage = (e) => on[e.data.type](e.data);
worker.onerror = (e) => notice(`the engine's worker failed: ${e.message}`);

if (!navigator.gpu) {
  notice(
    'This browser has no WebGPU (navigator.gpu is missing). Use a recent Chrome, Edge or Firefox with WebGPU enabled.',
  );
}
