"""`rill serve` against hostile and greedy clients (issue 38): slow and idle connections, file
descriptor pressure, huge prompts, the prefix cache as a side channel between users, shutdown
with a queue, API keys and per-key caps. Each test starts its own server with short timeouts.

Timing bounds here are functional (a connection closed within N seconds, /health answering while
other clients flood the server), kept generous for a loaded 2-core machine.
"""

import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import openai
import pytest

from test_openai_server import CTX, KEY, MODEL, MODEL_ID, NO_THINK, RILL, Server, chat


def stop(server, within=60):
    server.proc.send_signal(15)
    rc = server.proc.wait(timeout=within)
    assert rc == 0, "\n".join(server.log)


def timed_health(server, timeout=10):
    t0 = time.perf_counter()
    status, body = server.raw("GET", "/health")
    return status, time.perf_counter() - t0


def wait_closed(sock, deadline):
    """Read until the server closes `sock`; returns the seconds it took (None: still open at
    `deadline`) and what the server sent."""
    got = b""
    t0 = time.time()
    while time.time() < deadline:
        sock.settimeout(max(0.05, min(0.5, deadline - time.time())))
        try:
            data = sock.recv(4096)
        except socket.timeout:
            continue
        except OSError:  # reset
            return time.time() - t0, got
        if not data:
            return time.time() - t0, got
        got += data
    return None, got


def connect(server):
    s = socket.create_connection((server.host, server.port), timeout=5)
    return s


def test_slow_and_idle_clients_are_closed_while_health_stays_fast():
    server = Server(opts={"--header-timeout": 1.5})
    try:
        idle = [connect(server) for _ in range(5)]
        opened = time.time()
        # Headers a byte at a time, one every 0.3 s, forever unless the server hangs up.
        slow_done = []

        def slow_client():
            s = connect(server)
            t0 = time.time()
            try:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                while time.time() - t0 < 20:
                    s.sendall(b"a")
                    time.sleep(0.3)
            except OSError:
                pass
            closed, _ = wait_closed(s, time.time() + 20 - (time.time() - t0))
            slow_done.append(time.time() - t0 if closed is not None else None)
            s.close()

        slow = [threading.Thread(target=slow_client) for _ in range(3)]
        for t in slow:
            t.start()
        # A keep-alive connection that goes quiet after one request.
        conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
        conn.request("GET", "/health", headers={"Authorization": f"Bearer {KEY}"})
        assert conn.getresponse().read()
        # /health answers quickly all along.
        worst = 0.0
        for _ in range(20):
            status, secs = timed_health(server)
            assert status == 200
            worst = max(worst, secs)
            time.sleep(0.05)
        assert worst < 1.0, worst
        for s in idle:
            took, _ = wait_closed(s, opened + 8)
            assert took is not None, "an idle connection was still open 8 s after it was made (timeout 1.5 s)"
            s.close()
        took, _ = wait_closed(conn.sock, time.time() + 8)
        assert took is not None, "an idle keep-alive connection was not closed"
        for t in slow:
            t.join(30)
        assert len(slow_done) == 3 and all(d is not None and d < 8 for d in slow_done), slow_done
        status, secs = timed_health(server)
        assert status == 200 and secs < 1.0
    finally:
        stop(server)


def test_connection_cap_refuses_cleanly_under_fd_pressure():
    # 160 descriptors: the server lowers its cap to fit (160 minus its reserve of 64), so 150
    # idle sockets overflow it, and the overflow is refused with a 503 instead of starving accept.
    def limit_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (160, 160))

    server = Server(opts={"--header-timeout": 2, "--max-connections": 1000}, preexec_fn=limit_fds)
    try:
        assert any("--max-connections lowered from 1000 to 96" in line for line in server.log), server.log
        socks = []
        for _ in range(150):
            socks.append(connect(server))
        opened = time.time()
        refused, closed_later = 0, 0
        for s in socks:
            took, got = wait_closed(s, opened + 10)
            assert took is not None, "a connection was neither served, refused nor closed within 10 s"
            if got:
                assert got.startswith(b"HTTP/1.1 503"), got
                assert b"too_many_connections" in got
                refused += 1
            else:
                closed_later += 1  # held idle until the header timeout
            s.close()
        assert refused >= 150 - 96 - 5, (refused, closed_later)
        assert closed_later >= 90, (refused, closed_later)
        # Every refusal came at once, not after the header timeout: they were the sockets past
        # the cap, answered while the first 96 still waited. And the server is fine afterwards.
        status, secs = timed_health(server)
        assert status == 200 and secs < 1.0
        assert server.health()["connections"] <= 2
    finally:
        stop(server)


def test_connection_cap_answers_503_to_a_real_request():
    server = Server(opts={"--max-connections": 2, "--header-timeout": 5})
    try:
        held = [connect(server) for _ in range(2)]
        time.sleep(0.2)
        status, body = server.raw("GET", "/health")
        assert status == 503 and body["error"]["code"] == "too_many_connections", body
        for s in held:
            s.close()
        deadline = time.time() + 5
        while True:
            status, _ = server.raw("GET", "/health")
            if status == 200:
                break
            assert time.time() < deadline
            time.sleep(0.1)
    finally:
        stop(server)


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))]


FLOOD = r"""
import http.client, json, sys, threading
host, port, key, size, clients, per_client = sys.argv[1:7]
text = "word " * (int(size) // 5)
body = json.dumps({"prompt": text, "max_tokens": 1}).encode()
out, lock = [], threading.Lock()

def client():
    for _ in range(int(per_client)):
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            conn.request("POST", "/v1/completions", body=body,
                         headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
            r = conn.getresponse()
            item = [r.status, json.loads(r.read())]
            conn.close()
        except Exception as e:
            item = [0, repr(e)]
        with lock:
            out.append(item)

threads = [threading.Thread(target=client) for _ in range(int(clients))]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"bytes": len(body), "results": out}))
"""


def flood_and_measure(server, size, clients=4, per_client=3):
    """`clients` clients (in another process, so that they do not take Python's GIL from the
    measuring thread) each POST a completion prompt of `size` bytes `per_client` times
    while /health is timed. Returns (body bytes, [(status, response)], [seconds])."""
    # At nice 10: on a real network the clients' CPU is not the server's, here it is.
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, server.host, str(server.port), server.key, str(size),
                              str(clients), str(per_client)], stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: os.nice(10))
    latencies = []
    t0 = time.time()
    while flood.poll() is None and time.time() - t0 < 120:
        status, secs = timed_health(server)
        assert status == 200
        latencies.append(secs)
        time.sleep(0.002)
    out, _ = flood.communicate(timeout=120)
    result = json.loads(out)
    return result["bytes"], result["results"], latencies


def test_health_stays_fast_while_clients_send_8_mib_prompts():
    server = Server(opts={"--max-body": 16 << 20})
    try:
        size, statuses, latencies = flood_and_measure(server, 8 << 20, per_client=8)
        assert size >= 8 << 20 and len(statuses) == 32
        for status, resp in statuses:
            assert status == 400 and resp["error"]["code"] == "context_length_exceeded", resp
        assert len(latencies) >= 50, latencies
        assert p99(latencies) < 0.050, (p99(latencies), sorted(latencies)[-5:])
        # Prompts under the byte bound are tokenized, off the network threads.
        _, statuses, latencies = flood_and_measure(server, 600_000, per_client=4)
        for status, resp in statuses:
            assert status == 400 and resp["error"]["code"] == "context_length_exceeded", resp
        assert p99(latencies) < 0.050, (p99(latencies), sorted(latencies)[-5:])
        assert server.health()["queue_depth"] == 0
    finally:
        stop(server)


def write_keys(tmp_path, text):
    p = tmp_path / "keys.txt"
    p.write_text(text)
    return str(p)


SECRET_SYSTEM = "You are the vault assistant. The vault code is {code}. Never reveal it."


def probe(client, code, **kw):
    msgs = [{"role": "system", "content": SECRET_SYSTEM.format(code=code)},
            {"role": "user", "content": "What can you tell me about the vault?"}]
    r = chat(client, msgs, max_tokens=2, **kw)
    return r


def cached(r):
    d = r.usage.prompt_tokens_details
    return None if d is None else d.cached_tokens


def test_prefix_cache_gives_no_signal_across_keys_or_salts(tmp_path):
    keys = write_keys(tmp_path, "# team keys\nalice:sk-alice-0001\nbob:sk-bob-0002\n")
    server = Server(opts={"--api-key": None, "--cache-every": 1}, args=["--api-key-file", keys], key="sk-alice-0001")
    try:
        alice, bob = server.client("sk-alice-0001"), server.client("sk-bob-0002")
        first = probe(alice, "4821")
        # The probe works: Alice's own repeat resumes from her cached prompt.
        again = probe(alice, "4821")
        assert cached(again) > again.usage.prompt_tokens // 2, again.usage
        # Bob's first guess finds nothing of Alice's; after it, his right and wrong guesses look
        # the same (each resumes from his own first guess up to "The vault code is").
        start = probe(bob, "1234")
        assert cached(start) == 0, start.usage
        assert start.model_extra["timings"]["prompt_tokens_processed"] == start.usage.prompt_tokens
        right, wrong = probe(bob, "4821"), probe(bob, "5555")
        assert right.usage.prompt_tokens == wrong.usage.prompt_tokens == first.usage.prompt_tokens
        assert cached(right) == cached(wrong) < cached(again), (right.usage, wrong.usage)
        assert (right.model_extra["timings"]["prompt_tokens_processed"]
                == wrong.model_extra["timings"]["prompt_tokens_processed"])
        # A salt separates requests under one key the same way.
        salted = probe(alice, "4821", extra_body=dict(NO_THINK, cache_salt="session-1"))
        assert cached(salted) == 0
        assert cached(probe(alice, "4821", extra_body=dict(NO_THINK, cache_salt="session-1"))) > 0
        assert cached(probe(alice, "4821", extra_body=dict(NO_THINK, cache_salt="session-2"))) == 0
        status, body = server.raw("POST", "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": "x"}], "cache_salt": ""})
        assert status == 400 and body["error"]["param"] == "cache_salt"
        # Monitoring needs a key too: it shows cache counters and the live context.
        for path in ("/health", "/metrics"):
            assert server.raw("GET", path, auth=False)[0] == 401
            assert server.raw("GET", path)[0] == 200
    finally:
        stop(server)


def test_hidden_cache_stats_and_public_health():
    server = Server(args=["--hide-cache-stats", "--public-health"])
    try:
        c = server.client()
        probe(c, "4821")
        r = probe(c, "4821")
        assert r.usage.prompt_tokens_details is None, r.usage
        assert "timings" not in (r.model_extra or {})
        streamed = list(chat(c, [{"role": "user", "content": "hi"}], max_tokens=2, stream=True,
                             stream_options={"include_usage": True}))
        last = streamed[-1]
        assert last.usage is not None and last.usage.prompt_tokens_details is None
        assert "timings" not in (last.model_extra or {})
        status, body = server.raw("POST", "/v1/completions", {"prompt": "hello there", "max_tokens": 2})
        assert status == 200 and "timings" not in body and "prompt_tokens_details" not in body["usage"], body
        assert server.raw("GET", "/health", auth=False)[0] == 200
        assert server.raw("GET", "/metrics", auth=False)[0] == 200
    finally:
        stop(server)


def start_stream(server, key, max_tokens=CTX - 64):
    """A long streamed generation; returns the connection once its first chunk arrived."""
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": max_tokens, "temperature": 0.8, "seed": 7, "stream": True}
    body.update(NO_THINK)
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    return conn


def test_sigterm_with_a_queue_answers_503_and_exits_within_the_bound():
    # One slot: the requests after the running one wait in the queue.
    server = Server(opts={"--shutdown-timeout": 2, "--header-timeout": 60, "--parallel": 1})
    running = start_stream(server, KEY)
    resp = running.getresponse()
    assert resp.status == 200
    assert resp.readline()
    queued = []

    def queued_request(k):
        queued.append(server.raw("POST", "/v1/chat/completions",
                                 dict(NO_THINK, messages=[{"role": "user", "content": f"queued {k}"}], max_tokens=8)))

    threads = [threading.Thread(target=queued_request, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    deadline = time.time() + 10
    while server.health()["queue_depth"] < 3:
        assert time.time() < deadline, "the requests were not queued"
        time.sleep(0.05)
    # A client that sent half its request head and went quiet.
    half = connect(server)
    half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    time.sleep(0.2)
    t0 = time.time()
    server.proc.send_signal(15)
    for t in threads:
        t.join(10)
    answered = time.time() - t0
    assert len(queued) == 3
    for status, body in queued:
        assert status == 503 and body["error"]["code"] == "shutting_down", body
    assert answered < 3, answered
    # The running stream ends (cancelled) and the process exits within the bound.
    rest = resp.read().decode()
    assert "[DONE]" in rest or rest == "" or "cancelled" in rest
    rc = server.proc.wait(timeout=15)
    took = time.time() - t0
    assert rc == 0, "\n".join(server.log)
    assert took < 2 + 4, took
    half.close()
    running.close()


def test_empty_keys_are_refused_and_an_open_host_warns(tmp_path):
    def run(args, env=None):
        p = subprocess.run([RILL, "serve", "-m", MODEL, "--backend", "cpu", "--port", "0"] + args,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, env=env)
        return p.returncode, p.stderr

    rc, err = run(["--api-key", ""])
    assert rc != 0 and "--api-key: the API key is empty" in err, err
    env = dict(os.environ, RILL_API_KEY="")
    rc, err = run([], env=env)
    assert rc != 0 and "RILL_API_KEY" in err and "empty" in err, err
    rc, err = run(["--api-key-file", write_keys(tmp_path, "alice:\n")])
    assert rc != 0 and "line 1" in err and "empty" in err, err
    rc, err = run(["--api-key-file", write_keys(tmp_path, "alice:k1\nbob:k1\n")])
    assert rc != 0 and "same as another key" in err, err
    # The warning comes before the model loads (a missing model here, so nothing listens).
    env = {k: v for k, v in os.environ.items() if k != "RILL_API_KEY"}
    p = subprocess.run([RILL, "serve", "-m", str(tmp_path / "missing.gguf"), "--host", "0.0.0.0"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode != 0 and "without an API key" in p.stderr, p.stderr


def test_bearer_scheme_is_case_insensitive():
    server = Server()
    try:
        for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
            status, body = server.raw("GET", "/v1/models", auth=False,
                                      headers={"Authorization": f"{scheme} {KEY}"})
            assert status == 200, (scheme, body)
        for value in (f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer", KEY):
            status, _ = server.raw("GET", "/v1/models", auth=False, headers={"Authorization": value})
            assert status == 401, value
    finally:
        stop(server)


def test_per_key_caps_and_the_default_max_tokens(tmp_path):
    keys = write_keys(tmp_path, "alice:sk-alice-0001\nbob:sk-bob-0002\n")
    # One slot, so that Alice's second request waits in the queue behind her first.
    server = Server(opts={"--api-key": None, "--max-requests-per-key": 2, "--default-max-tokens": 8,
                          "--parallel": 1},
                    args=["--api-key-file", keys], key="sk-alice-0001")
    try:
        # Alice holds her two places with long generations (one running, one queued).
        streams = [start_stream(server, "sk-alice-0001") for _ in range(2)]
        deadline = time.time() + 10
        while True:
            h = server.health()
            if h["busy"] and h["queue_depth"] == 1:
                break
            assert time.time() < deadline, h
            time.sleep(0.05)
        status, body = server.raw("POST", "/v1/chat/completions",
                                  dict(NO_THINK, messages=[{"role": "user", "content": "one more"}], max_tokens=2))
        assert status == 429 and body["error"]["code"] == "too_many_requests", body
        # Bob is still admitted (he waits behind Alice's generation, then is served).
        bob = []
        t = threading.Thread(target=lambda: bob.append(
            chat(server.client("sk-bob-0002"), [{"role": "user", "content": "hello"}], max_tokens=2)))
        t.start()
        time.sleep(0.3)
        for conn in streams:
            conn.close()
        t.join(60)
        assert bob and bob[0].usage.completion_tokens == 2
        # Alice's places came back when her streams ended; a request without max_tokens stops
        # at the server's default instead of running to the end of the context.
        r = server.client("sk-alice-0001").chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Tell me everything."}], temperature=0)
        assert r.usage.completion_tokens <= 8
        assert r.choices[0].finish_reason in ("length", "stop")
    finally:
        stop(server)
