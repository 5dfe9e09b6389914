#!/usr/bin/env python3
"""Time to first token of a long chat's later turns, with and without the prefix cache.

Starts `rill serve` twice on one model: with the cache (`--cache-mem`), playing a whole
conversation of --turns turns (each user message about --user-words words, replies of
--reply-tokens tokens, greedy, thinking off), and without it (`--cache-mem 0`), sending only the
last turn with the same history (without a cache no earlier request can help it). Before each
turn the script waits until the server is idle, as a person reading the reply would (the server
caches the conversation the way the next turn renders it right after answering).

TTFT is measured by the client: from sending the request to the first streamed token (text or
reasoning), over plain HTTP on localhost. The server's own numbers (prompt tokens, tokens taken
from the cache, first-token time inside the model thread) come from the usage chunk.

Python standard library only (runs where the openai package is not installed).

    python3 scripts/ttft.py --rill target/release/rill --model M.gguf --backend cpu --out DIR
"""

import argparse
import http.client
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which "
         "but have an they you were her she there been one all we their has would when if so no will "
         "more about can out up them some could what into than then its time only other new two my "
         "these may first any like over such our also most after very where how just made through "
         "system model state cache token layer memory river stone garden engine window signal").split()


class Server:
    def __init__(self, rill, model, backend, ctx, cache_mem, log_path):
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [rill, "serve", "-m", model, "--backend", backend, "--port", "0", "--ctx", str(ctx),
             "--cache-mem", cache_mem],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        ready = threading.Event()
        self.port = None

        def drain():
            for line in self.proc.stderr:
                self.log.write(line)
                self.log.flush()
                if line.startswith("listening on http://"):
                    self.port = int(line.strip().rsplit(":", 1)[1])
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(1800) or self.port is None:
            self.proc.kill()
            raise RuntimeError(f"rill serve did not start; see {log_path}")

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        c.request("GET", path)
        r = c.getresponse()
        body = json.loads(r.read())
        c.close()
        return body

    def wait_idle(self):
        while True:
            h = self.get("/health")
            if not h["busy"] and h["queue_depth"] == 0:
                return h
            time.sleep(0.02)

    def chat(self, messages, max_tokens):
        """Stream one chat request; returns (client TTFT s, total s, reply text, usage)."""
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "chat_template_kwargs": {"enable_thinking": False}}
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:500]!r}")
        ttft, text, usage = None, [], None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk.get("usage"):
                usage = chunk["usage"]
                usage["timings"] = chunk.get("timings")
            for ch in chunk.get("choices", []):
                d = ch.get("delta", {})
                piece = d.get("content") or d.get("reasoning_content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(d.get("content") or "")
        total = time.perf_counter() - t0
        c.close()
        return ttft if ttft is not None else total, total, "".join(text), usage

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def user_message(rng, turn, words):
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Turn {turn + 1}. Please think about the following notes and answer briefly: {body}."


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rill", default="target/release/rill")
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--user-words", type=int, default=300)
    ap.add_argument("--reply-tokens", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--cache-mem", default="4G")
    ap.add_argument("--repeat", type=int, default=2, help="timed runs of the cold last turn")
    ap.add_argument("--out", default="ttft-out")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1234)
    users = [user_message(rng, t, a.user_words) for t in range(a.turns)]
    results = {"model": a.model, "backend": a.backend, "turns": a.turns, "user_words": a.user_words,
               "reply_tokens": a.reply_tokens}

    # With the cache: the whole conversation, turn by turn.
    s = Server(a.rill, a.model, a.backend, a.ctx, a.cache_mem, out / "serve-cache.log")
    try:
        s.chat([{"role": "user", "content": "warm up"}], 2)
        messages, turns = [], []
        for t in range(a.turns):
            messages.append({"role": "user", "content": users[t]})
            s.wait_idle()
            ttft, total, reply, usage = s.chat(messages, a.reply_tokens)
            messages.append({"role": "assistant", "content": reply})
            row = {"turn": t + 1, "ttft_s": ttft, "total_s": total, "prompt_tokens": usage["prompt_tokens"],
                   "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                   "server_first_token_ms": usage["timings"]["first_token_ms"]}
            turns.append(row)
            print(f"cache    turn {t + 1:2d}: prompt {row['prompt_tokens']:5d} tokens, "
                  f"{row['cached_tokens']:5d} cached, TTFT {row['server_first_token_ms']:8.1f} ms server, "
                  f"{ttft * 1e3:8.1f} ms client", flush=True)
        results["cache"] = {"turns": turns, "health": s.wait_idle()}
    finally:
        s.stop()

    # Without: the last turn only, with the same history (the replies of the cached run).
    last_messages = messages[:-1]
    s = Server(a.rill, a.model, a.backend, a.ctx, "0", out / "serve-nocache.log")
    try:
        s.chat([{"role": "user", "content": "warm up"}], 2)
        runs = []
        for r in range(a.repeat):
            s.wait_idle()
            ttft, total, reply, usage = s.chat(last_messages, a.reply_tokens)
            runs.append({"ttft_s": ttft, "prompt_tokens": usage["prompt_tokens"],
                         "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                         "server_first_token_ms": usage["timings"]["first_token_ms"]})
            print(f"no cache turn {a.turns:2d}: prompt {usage['prompt_tokens']:5d} tokens, "
                  f"{runs[-1]['cached_tokens']:5d} cached, TTFT {ttft * 1e3:8.1f} ms", flush=True)
        # The cost of the new tokens alone: the last user message as a conversation of its own.
        alone = []
        for r in range(a.repeat):
            s.wait_idle()
            ttft, total, reply, usage = s.chat([last_messages[-1]], a.reply_tokens)
            alone.append({"ttft_s": ttft, "prompt_tokens": usage["prompt_tokens"],
                          "server_first_token_ms": usage["timings"]["first_token_ms"]})
            print(f"no cache, last user message alone: prompt {usage['prompt_tokens']:5d} tokens, "
                  f"TTFT {ttft * 1e3:8.1f} ms", flush=True)
        results["nocache"] = {"runs": runs, "new_message_alone": alone}
    finally:
        s.stop()

    last = results["cache"]["turns"][-1]
    mean = lambda rows, k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
    new_tokens = last["prompt_tokens"] - last["cached_tokens"]
    # The server's first-token time (request taken up to first token sampled: restore, prefill,
    # sampling) is the model-side TTFT; the client's adds HTTP and waits for the first token that
    # decodes to visible text (random-weight models start with whitespace or partial characters).
    summary = (
        f"turn {a.turns}: {last['prompt_tokens']} prompt tokens. Server-side TTFT: without cache "
        f"{mean(runs, 'server_first_token_ms'):.0f} ms (all tokens run), with cache "
        f"{last['server_first_token_ms']:.0f} ms ({new_tokens} new tokens run, {last['cached_tokens']} cached), "
        f"the new message alone in a fresh conversation ({alone[0]['prompt_tokens']} tokens) "
        f"{mean(alone, 'server_first_token_ms'):.0f} ms. Client-side (first visible text): "
        f"{mean(runs, 'ttft_s') * 1e3:.0f} / {last['ttft_s'] * 1e3:.0f} / {mean(alone, 'ttft_s') * 1e3:.0f} ms")
    results["summary"] = summary
    print(summary)
    (out / "ttft.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
