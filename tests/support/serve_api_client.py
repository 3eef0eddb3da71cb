#!/usr/bin/env python3
"""Drives `ds4-chat serve` with the official `openai` package (tests/app/serve_api.rs starts the server).

  serve_api_client.py main --base URL --model NAME --bin DS4_CHAT --model-file GGUF --ctx N --max-body N
  serve_api_client.py auth --base URL --model NAME --key KEY

`main` expects the server started with `--queue 1`. Every check prints one line; the last line is
'N passed, N failed' and the exit status is 0 only when nothing failed.
"""

import argparse
import http.client
import json
import socket
import subprocess
import threading
import time
import urllib.parse

import openai

from serve_checks import check, run_checks

SYSTEM = "You are a helpful assistant"
PROMPT = "Tell me about the sea."
def client(args, key="none", retries=0):
    return openai.OpenAI(base_url=args.base + "/v1", api_key=key, max_retries=retries, timeout=120)


def raw(args, method, path, body=None, headers=None, timeout=60):
    """(status, parsed JSON or text) of one plain HTTP request."""
    u = urllib.parse.urlparse(args.base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    data = body if isinstance(body, (bytes, type(None))) else body.encode()
    conn.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
    r = conn.getresponse()
    text = r.read().decode("utf-8", "replace")
    conn.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text


def health(args):
    return raw(args, "GET", "/health")[1]


def wait_idle(args, within):
    """Seconds until /health says nothing generates, or None after `within` seconds."""
    t0 = time.time()
    while time.time() - t0 < within:
        if not health(args)["generating"]:
            return time.time() - t0
        time.sleep(0.01)
    return None


def ds4_run(args, think, temp, seed, top_k, max_tokens, prompt=PROMPT):
    """(answer, reasoning) of `ds4-chat run` with the same settings (stdout / stderr)."""
    cmd = [args.bin, "run", "-m", args.model_file, "-p", prompt, "--system", SYSTEM, think,
           "--temp", str(temp), "--seed", str(seed), "--top-k", str(top_k), "-n", str(max_tokens),
           "--ctx", str(args.ctx), "--backend", "cpu", "--threads", "2"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"ds4-chat run failed: {p.stderr}")
    err_lines = p.stderr.split("\n")
    # The last stderr line is run's speed summary.
    stats = [i for i, l in enumerate(err_lines) if l.startswith("ds4-chat: prompt ")]
    reasoning = "\n".join(err_lines[: stats[-1]])
    return p.stdout, reasoning


def as_printed(text):
    """What run prints for a text stream: it ends a non-empty text with a newline."""
    return text if text == "" or text.endswith("\n") else text + "\n"


def timings_ok(t):
    keys = ["prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second"]
    return isinstance(t, dict) and all(isinstance(t.get(k), (int, float)) for k in keys)


def messages(*turns):
    out = [{"role": "system", "content": SYSTEM}]
    for i, t in enumerate(turns):
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": t})
    return out


def main_checks(args):
    c = client(args)
    models = c.models.list()
    check("models lists the served model", [m.id for m in models.data] == [args.model], models)

    # Non-streaming, no thinking: the answer equals `ds4-chat run` with the same seed and settings.
    want_answer, _ = ds4_run(args, "--nothink", 0.8, 7, 40, 24)
    r = c.chat.completions.create(model=args.model, messages=messages(PROMPT), temperature=0.8, seed=7,
                                  max_tokens=24, reasoning_effort="none", extra_body={"top_k": 40})
    text = r.choices[0].message.content
    check("non-streaming text equals ds4-chat run", text != "" and as_printed(text) == want_answer,
          f"serve {text!r} vs run {want_answer!r}")
    check("non-streaming usage", r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
          and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)
    check("non-streaming finish_reason", r.choices[0].finish_reason in ("stop", "length"), r.choices[0])
    check("non-streaming timings", timings_ok((r.model_extra or {}).get("timings")), r.model_extra)

    # The follow-up extends the conversation: its prompt starts with everything cached.
    first = r.usage
    r2 = c.chat.completions.create(model=args.model, messages=messages(PROMPT, text, "And the sky?"),
                                   max_tokens=4, reasoning_effort="none", seed=1)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    check("follow-up reuses the live cache (cached tokens = previous prompt + answer)",
          cached == first.prompt_tokens + first.completion_tokens and r2.usage.prompt_tokens > cached,
          f"cached {cached}, previous {first.prompt_tokens}+{first.completion_tokens}, now {r2.usage.prompt_tokens}")

    # Streaming with thinking: reasoning_content and content equal run's stderr and stdout.
    want_answer, want_reasoning = ds4_run(args, "--think", 1.0, 11, 0, 30)
    stream = c.chat.completions.create(model=args.model, messages=messages(PROMPT), seed=11, max_tokens=30,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"thinking": {"type": "enabled"}})
    content, reasoning, finish, usage, timings, n_chunks = "", "", None, None, None, 0
    for ch in stream:
        n_chunks += 1
        extra = ch.model_extra or {}
        if extra.get("timings"):
            timings = extra["timings"]
        if ch.usage:
            usage = ch.usage
        for choice in ch.choices:
            d = choice.delta
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            finish = choice.finish_reason or finish
    check("streaming sends several chunks", n_chunks > 5, n_chunks)
    # run's stderr holds the reasoning, a newline when it did not end with one, then the summary line.
    check("streaming reasoning_content equals ds4-chat run's reasoning",
          reasoning != "" and reasoning in (want_reasoning, want_reasoning + "\n"),
          f"serve {reasoning!r} vs run {want_reasoning!r}")
    check("streaming content equals ds4-chat run's answer", as_printed(content) == want_answer,
          f"serve {content!r} vs run {want_answer!r}")
    check("streaming finish_reason", finish in ("stop", "length"), finish)
    check("streaming usage (include_usage)", usage is not None and usage.completion_tokens > 0
          and usage.prompt_tokens_details is not None, usage)
    check("streaming timings", timings_ok(timings), timings)

    # Thinking follow-up: the client drops reasoning_content; the server restores it and reuses the cache.
    r3 = c.chat.completions.create(model=args.model, messages=messages(PROMPT, content, "More?"),
                                   max_tokens=2, seed=1, extra_body={"thinking": True})
    cached = r3.usage.prompt_tokens_details.cached_tokens
    check("thinking follow-up reuses the live cache",
          cached == usage.prompt_tokens + usage.completion_tokens,
          f"cached {cached}, previous {usage.prompt_tokens}+{usage.completion_tokens}")

    concurrency(args, c)
    hangups(args, c)
    malformed(args, c)


def concurrency(args, c):
    """A long stream runs; a second client waits in the queue (of 1) and gets the right answer
    after the first finishes; a third finds the queue full (429)."""
    want_answer, _ = ds4_run(args, "--nothink", 0.8, 7, 40, 24)
    first_chunk = threading.Event()
    a_done = {}

    def long_stream():
        s = c.chat.completions.create(model=args.model, messages=messages("Count."), max_tokens=150, seed=3,
                                      reasoning_effort="none", stream=True)
        for _ in s:
            first_chunk.set()
        a_done["t"] = time.time()

    b_result = {}

    def waiting_client():
        r = c.chat.completions.create(model=args.model, messages=messages(PROMPT), temperature=0.8, seed=7,
                                      max_tokens=24, reasoning_effort="none", extra_body={"top_k": 40})
        b_result["text"] = r.choices[0].message.content
        b_result["t"] = time.time()

    ta = threading.Thread(target=long_stream)
    ta.start()
    first_chunk.wait(60)
    tb = threading.Thread(target=waiting_client)
    tb.start()
    t0 = time.time()
    while health(args)["queued"] < 1 and time.time() - t0 < 30:
        time.sleep(0.01)
    h = health(args)
    check("second client waits in the queue", h["generating"] and h["queued"] == 1, h)
    try:
        c.chat.completions.create(model=args.model, messages=messages("x"), max_tokens=1)
        check("third client is refused while the queue is full", False, "no error")
    except openai.RateLimitError as e:
        check("third client is refused while the queue is full (429)", e.status_code == 429
              and "queue" in str(e), e)
    ta.join(120)
    tb.join(120)
    check("waiting client answered after the running one finished", "t" in b_result and "t" in a_done
          and b_result["t"] >= a_done["t"], (a_done, b_result))
    check("waiting client's answer equals ds4-chat run", as_printed(b_result.get("text", "")) == want_answer,
          b_result)


def hangups(args, c):
    """A client that hangs up stops the engine; the next request works."""
    stream = c.chat.completions.create(model=args.model, messages=messages("Go on forever."), max_tokens=100000,
                                       seed=5, reasoning_effort="none", stream=True)
    got = 0
    for _ in stream:
        got += 1
        if got == 3:
            break
    stream.close()
    idle = wait_idle(args, 3.0)
    h = health(args)
    # A decode step of the tiny model takes ~10 ms; a second allows for a loaded CI machine.
    check("a streaming client that disconnects stops the engine within a second",
          idle is not None and idle < 1.0, f"idle after {idle} s: {h}")
    print(f"     (engine idle {idle:.3f} s after the hang-up)" if idle is not None else "")
    last = h.get("last_turn") or {}
    check("the disconnected stream's turn was cancelled early", last.get("finish_reason") == "cancelled"
          and last.get("completion_tokens", 1 << 30) < 1000, last)

    # Non-streaming: the server watches the socket while it generates.
    u = urllib.parse.urlparse(args.base)
    body = json.dumps({"model": args.model, "messages": messages("Go on."), "max_tokens": 100000,
                       "reasoning_effort": "none"})
    s = socket.create_connection((u.hostname, u.port))
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    t0 = time.time()
    while not health(args)["generating"] and time.time() - t0 < 10:
        time.sleep(0.01)
    time.sleep(0.3)
    s.close()
    idle = wait_idle(args, 3.0)
    h = health(args)
    check("a non-streaming client that disconnects stops the engine within a second",
          idle is not None and idle < 1.0
          and (h.get("last_turn") or {}).get("finish_reason") == "cancelled", h)

    r = c.chat.completions.create(model=args.model, messages=messages("Hi"), max_tokens=3, reasoning_effort="none")
    check("the next request after a hang-up works", r.usage.completion_tokens > 0, r)

    # A client that leaves while queued is skipped: the running turn is the last one.
    running = threading.Thread(target=lambda: c.chat.completions.create(
        model=args.model, messages=messages("Count."), max_tokens=100, seed=3, reasoning_effort="none"))
    running.start()
    t0 = time.time()
    while not health(args)["generating"] and time.time() - t0 < 10:
        time.sleep(0.005)
    s = socket.create_connection((u.hostname, u.port))
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    while health(args)["queued"] < 1 and time.time() - t0 < 10:
        time.sleep(0.005)
    queued = health(args)["queued"]
    s.close()
    running.join(120)
    wait_idle(args, 3.0)
    h = health(args)
    last = h.get("last_turn") or {}
    check("a client that leaves while queued is skipped", queued == 1 and last.get("finish_reason") == "length"
          and last.get("completion_tokens") == 100 and h["queued"] == 0, (queued, h))


def malformed(args, c):
    """Bad requests: each a 4xx JSON error naming the problem; the server stays up."""
    ok_msgs = [{"role": "user", "content": "hi"}]

    def body(**fields):
        b = {"model": args.model, "messages": ok_msgs}
        b.update(fields)
        return json.dumps({k: v for k, v in b.items() if v is not ...})

    long_text = "sea " * (args.ctx + 100)
    cases = [
        ("malformed JSON", "POST", "/v1/chat/completions", '{"model": ', 400, "JSON"),
        ("body not an object", "POST", "/v1/chat/completions", "[1, 2]", 400, "JSON object"),
        ("missing messages", "POST", "/v1/chat/completions", body(messages=...), 400, "messages"),
        ("messages not an array", "POST", "/v1/chat/completions", body(messages="hi"), 400, "messages"),
        ("empty messages", "POST", "/v1/chat/completions", body(messages=[]), 400, "messages"),
        ("bad role", "POST", "/v1/chat/completions", body(messages=[{"role": "wizard", "content": "x"}]), 400,
         "messages[0].role"),
        ("missing content", "POST", "/v1/chat/completions", body(messages=[{"role": "user"}]), 400,
         "messages[0].content"),
        ("last message not from the user", "POST", "/v1/chat/completions",
         body(messages=ok_msgs + [{"role": "assistant", "content": "a"}]), 400, "messages[1].role"),
        ("image content part", "POST", "/v1/chat/completions",
         body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
         "messages[0].content[0].type"),
        ("temperature of the wrong type", "POST", "/v1/chat/completions", body(temperature="hot"), 400, "temperature"),
        ("temperature out of range", "POST", "/v1/chat/completions", body(temperature=-1), 400, "temperature"),
        ("top_p out of range", "POST", "/v1/chat/completions", body(top_p=0), 400, "top_p"),
        ("top_k not an integer", "POST", "/v1/chat/completions", body(top_k=1.5), 400, "top_k"),
        ("max_tokens zero", "POST", "/v1/chat/completions", body(max_tokens=0), 400, "max_tokens"),
        ("negative seed", "POST", "/v1/chat/completions", body(seed=-3), 400, "seed"),
        ("stream not a bool", "POST", "/v1/chat/completions", body(stream="yes"), 400, "stream"),
        ("n above 1", "POST", "/v1/chat/completions", body(n=2), 400, "n"),
        ("unknown reasoning_effort", "POST", "/v1/chat/completions", body(reasoning_effort="extreme"), 400,
         "reasoning_effort"),
        ("unknown model", "POST", "/v1/chat/completions", body(model="gpt-4o"), 404, "model"),
        ("missing model", "POST", "/v1/chat/completions", body(model=...), 400, "model"),
        ("context overflow", "POST", "/v1/chat/completions",
         body(messages=[{"role": "user", "content": long_text}], reasoning_effort="none"), 400, "context"),
        ("body over the size limit", "POST", "/v1/chat/completions", "x" * (args.max_body + 1), 413, "limit"),
        ("wrong method", "GET", "/v1/chat/completions", None, 405, "POST"),
        ("unknown route", "GET", "/v1/nothing", None, 404, "/v1/nothing"),
    ]
    for name, method, path, data, status, needle in cases:
        got, reply = raw(args, method, path, data)
        err = reply.get("error", {}) if isinstance(reply, dict) else {}
        msg = err.get("message", "")
        check(f"malformed: {name} -> {status}", got == status and needle in msg and "type" in err,
              f"{got} {reply!r}"[:300])
        check(f"server up after: {name}", health(args)["status"] == "ok")

    # The same refusals reach the openai client as its typed errors.
    try:
        c.chat.completions.create(model=args.model, messages=ok_msgs, temperature=-1)
        check("openai client gets BadRequestError naming the field", False, "no error")
    except openai.BadRequestError as e:
        check("openai client gets BadRequestError naming the field", "temperature" in str(e), e)
    try:
        c.chat.completions.create(model="gpt-4o", messages=ok_msgs)
        check("openai client gets NotFoundError for an unknown model", False, "no error")
    except openai.NotFoundError as e:
        check("openai client gets NotFoundError for an unknown model", "gpt-4o" in str(e), e)


def auth_checks(args):
    for label, key in [("no key", None), ("wrong key", args.key + "x")]:
        status, reply = raw(args, "GET", "/v1/models",
                            headers={} if key is None else {"Authorization": f"Bearer {key}"})
        check(f"{label}: /v1/models is 401", status == 401 and "key" in reply["error"]["message"], reply)
    try:
        client(args, key="wrong").chat.completions.create(model=args.model,
                                                          messages=[{"role": "user", "content": "hi"}])
        check("wrong key: openai client gets AuthenticationError", False, "no error")
    except openai.AuthenticationError as e:
        check("wrong key: openai client gets AuthenticationError", e.status_code == 401, e)
    r = client(args, key=args.key).chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    check("right key: completion", r.usage.completion_tokens > 0, r)
    check("health needs no key", raw(args, "GET", "/health")[0] == 200)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["main", "auth"])
    p.add_argument("--base", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--bin")
    p.add_argument("--model-file")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--max-body", type=int, default=65536)
    p.add_argument("--key")
    args = p.parse_args()
    run_checks(lambda: main_checks(args) if args.mode == "main" else auth_checks(args))


if __name__ == "__main__":
    main()
