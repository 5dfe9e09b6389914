"""Continuous batching in `rill serve`: many streaming clients at once get, token for token, what
each gets alone, while requests join and leave the batch, a client disconnects mid-stream, a
malformed request comes in, prompts of several hundred tokens run chunk by chunk between decode
steps, and more requests wait than there are slots. /metrics shows the batch while it runs.

On the CPU a batched decode row is bit-identical to the same sequence decoded alone
(tests/batch.rs), so answers must match exactly: greedy ones, and seeded sampled ones (their rows
make the batch return logits, sampled on the host by each request's own sampler). Each request carries its own
`cache_salt`, in both passes: every prompt runs from the start, so the prompt's state is computed
in the same chunks alone and in the batch.
"""

import http.client
import json
import threading
import time

from test_openai_server import KEY, MODEL_ID, NO_THINK, Server

PARALLEL = 8
CLIENTS = 18


SAMPLED = {3: 0.9, 11: 0.7}


def prompt(k):
    """Client k's conversation and answer length: short and long prompts (up to about 1100
    tokens, over the 512-token prefill chunk), short and long answers."""
    words = " ".join(f"item{(k * 31 + i) % 97}" for i in range(3 + (k * 53) % 40))
    if k % 5 == 0:
        words += " " + "filler text " * (150 + 60 * (k // 5))
    msgs = [{"role": "system", "content": f"You are assistant number {k}."},
            {"role": "user", "content": f"Question {k}: {words}"}]
    return msgs, 6 + (k * 13) % 41


def stream(server, msgs, max_tokens, salt, out, key):
    """Stream one chat completion (greedy, or sampled with a seed for the clients in SAMPLED);
    puts (text, finish_reason, completion_tokens) in out[key]."""
    parts, finish, usage = [], None, None
    sampling = {"temperature": SAMPLED[key], "seed": key} if key in SAMPLED else {"temperature": 0}
    for chunk in server.client().chat.completions.create(
            model=MODEL_ID, messages=msgs, max_tokens=max_tokens, stream=True, **sampling,
            stream_options={"include_usage": True}, extra_body=dict(NO_THINK, cache_salt=salt)):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
            parts.append((ch.delta.model_extra or {}).get("reasoning_content") or "")
            finish = ch.finish_reason or finish
    out[key] = ("".join(parts), finish, usage.completion_tokens)


def metrics(server):
    status, text = server.raw("GET", "/metrics")
    assert status == 200, text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}


class Watcher:
    """Polls /metrics and /health while a test runs; keeps the largest values seen."""

    def __init__(self, server):
        self.server, self.most, self.health, self.stop = server, {}, [], threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            for name, value in metrics(self.server).items():
                self.most[name] = max(value, self.most.get(name, value))
            self.health.append(self.server.health()["batch"])
            time.sleep(0.01)

    def finish(self):
        self.stop.set()
        self.thread.join(30)
        return self.most


def disconnect_mid_stream(server, seen):
    """A long streamed generation whose client goes away after a few chunks."""
    body = dict(NO_THINK, model=MODEL_ID, messages=[{"role": "user", "content": "Write a very long story."}],
                max_tokens=1500, temperature=0, stream=True)
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    chunks = 0
    while chunks < 5:
        line = resp.readline()
        assert line, "stream ended early"
        if line.startswith(b"data: {"):
            chunks += 1
    conn.sock.close()
    conn.close()
    seen.append(chunks)


def test_concurrent_streams_equal_their_answers_alone_and_metrics_show_the_batch():
    # One key for every client: no per-key cap, so that all of them are in flight at once.
    server = Server(opts={"--parallel": PARALLEL, "--max-queue": 32, "--max-requests-per-key": 0})
    try:
        assert any(line.startswith(f"batch: {PARALLEL} sequences of ") and "MiB in total" in line
                   for line in server.log), server.log
        alone = {}
        for k in range(CLIENTS):
            msgs, n = prompt(k)
            stream(server, msgs, n, f"alone-{k}", alone, k)
        # Answers differ between prompts (the test would prove little otherwise).
        assert len({a[0] for a in alone.values()}) == CLIENTS
        before = server.idle_health()
        batched, errors, gone, bad = {}, [], [], []
        start = threading.Barrier(CLIENTS + 2)

        def client(k):
            start.wait()
            time.sleep(0.01 * (k % 4))  # join at different steps
            try:
                msgs, n = prompt(k)
                stream(server, msgs, n, f"batch-{k}", batched, k)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append((k, repr(e)))

        def leaver():
            start.wait()
            disconnect_mid_stream(server, gone)

        def malformed():
            start.wait()
            time.sleep(0.05)
            bad.append(server.raw("POST", "/v1/chat/completions", "{not json"))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
        threads += [threading.Thread(target=leaver), threading.Thread(target=malformed)]
        watcher = Watcher(server)
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        most = watcher.finish()
        assert not errors, errors
        for k in range(CLIENTS):
            assert batched[k] == alone[k], (k, batched[k], alone[k])
        assert gone == [5]
        assert bad and bad[0][0] == 400 and bad[0][1]["error"]["type"] == "invalid_request_error", bad
        after = server.idle_health()
        req = after["requests"]
        assert req["completed"] - before["requests"]["completed"] == CLIENTS, after
        assert req["cancelled"] - before["requests"]["cancelled"] == 1, after
        assert req["failed"] == 0, after
        # The batch as /metrics showed it: full (every slot decoding), never over the slots,
        # with requests waiting behind it, and many tokens per decode step on the whole.
        assert most["rill_batch_slots"] == PARALLEL
        assert 2 <= most["rill_batch_size"] <= PARALLEL, most
        assert most["rill_requests_running"] <= PARALLEL, most
        assert most["rill_requests_waiting"] >= 1, most
        assert most["rill_generated_tokens_per_second"] > 0, most
        steps = after["batch"]["decode_steps"] - before["batch"]["decode_steps"]
        tokens = after["batch"]["generated_tokens"] - before["batch"]["generated_tokens"]
        assert tokens >= sum(a[2] for a in alone.values()) and tokens / steps > 2, (tokens, steps)
        assert any(h["decoding"] >= 2 and h["running"] == h["decoding"] + h["prefilling"] for h in watcher.health)
        # Idle again: nothing running, nothing waiting.
        b = after["batch"]
        assert (b["running"], b["waiting"], b["size"]) == (0, 0, 0), b
    finally:
        server.stop()


def test_a_short_prompt_is_not_stuck_behind_a_long_one():
    # The long prompt is about 2550 tokens (5 chunks of 512). The short one, sent while it runs,
    # takes turns with it chunk by chunk and answers first.
    server = Server(opts={"--parallel": 2, "--ctx": 4096})
    try:
        done = []

        def ask(name, text, n):
            r = server.client().completions.create(model=MODEL_ID, prompt=text, max_tokens=n, temperature=0)
            done.append((name, r.usage.completion_tokens))

        long = threading.Thread(target=ask, args=("long", "filler text " * 850, 4))
        short = threading.Thread(target=ask, args=("short", "a short prompt", 4))
        long.start()
        deadline = time.time() + 10
        while server.health()["batch"]["prefilling"] < 1:
            assert time.time() < deadline
            time.sleep(0.002)
        short.start()
        long.join(120)
        short.join(120)
        assert [name for name, _ in done] == ["short", "long"], done
        assert all(n == 4 for _, n in done), done
    finally:
        server.stop()


def test_parallel_is_validated():
    import subprocess
    from test_openai_server import MODEL, RILL
    p = subprocess.run([RILL, "serve", "-m", MODEL, "--backend", "cpu", "--port", "0", "--parallel", "0"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--parallel" in p.stderr, p.stderr


def test_interleaved_prompts_of_two_keys_cache_only_for_their_own_key(tmp_path):
    # Two keys' long prompts (several chunks each) run at once, taking turns in the engine's live
    # session; every snapshot taken on the way must go to the cache of the key whose prompt it is.
    keys = tmp_path / "keys.txt"
    keys.write_text("alice:sk-alice-0001\nbob:sk-bob-0002\n")
    server = Server(opts={"--api-key": None, "--parallel": 4, "--cache-every": 64},
                    args=["--api-key-file", str(keys)], key="sk-alice-0001")
    try:
        alice, bob = server.client("sk-alice-0001"), server.client("sk-bob-0002")
        text = {"alice": "alpha words " * 400, "bob": "beta words " * 400}
        first = {}

        def ask(who, client):
            first[who] = client.completions.create(model=MODEL_ID, prompt=text[who], max_tokens=3, temperature=0)

        threads = [threading.Thread(target=ask, args=("alice", alice)), threading.Thread(target=ask, args=("bob", bob))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert first["alice"].usage.prompt_tokens > 1000 and first["bob"].usage.prompt_tokens > 1000

        def cached(client, who):
            r = client.completions.create(model=MODEL_ID, prompt=text[who], max_tokens=3, temperature=0)
            assert r.choices[0].text == first[who].choices[0].text
            return r.usage.prompt_tokens_details.cached_tokens

        assert cached(bob, "alice") == 0
        assert cached(alice, "bob") == 0
        assert cached(alice, "alice") > 1000
        assert cached(bob, "bob") > 1000
    finally:
        server.stop()
