#!/usr/bin/env python3
"""A fake OpenAI-compatible chat server (Python stdlib only) for the `--remote` end-to-end tests.

    python3 tests/support/fake_openai.py [--port 0] [--api-key KEY]

Prints "PORT <n>" once listening. `GET /v1/models` lists `fake-model` (max_model_len 4096);
`POST /v1/chat/completions` streams server-sent events chosen by the last user message:

  contains "inline"  the answer with its reasoning inline: <think>inline thoughts</think>Inline answer.
  contains "fail"    500 with an OpenAI error object
  contains "cut"     a few answer chunks, then the connection closes without [DONE]
  contains "slow"    the response head and one empty chunk, then silence (for the client's timeout)
  contains "long"    400 answer chunks, one every 50 ms (for Esc and a server killed mid-answer)
  otherwise          reasoning_content chunks, then content chunks, finish_reason, usage and timings

With --api-key every request needs "Authorization: Bearer KEY" (else 401). An unknown model is a
404. Each request's outcome is printed ("DONE", "DISCONNECTED", ...) so tests can tell that a
client closed its stream.
"""

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "fake-model"
REASONING = ["Rayleigh ", "scattering ", "favours ", "short ", "wavelengths; ", "blue ", "light ",
             "is ", "scattered ", "most."]
ANSWER = ["The ", "sky ", "looks ", "blue ", "because ", "air ", "scatters ", "blue ", "light ",
          "more ", "than ", "red."]


def log(*parts):
    print(*parts, flush=True)


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: no chunked encoding, the stream ends when the connection closes.
    protocol_version = "HTTP/1.0"
    api_key = None

    def log_message(self, *args):
        pass

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, message, kind):
        self.send_json(status, {"error": {"message": message, "type": kind, "code": status}})

    def authorized(self):
        if self.api_key is None:
            return True
        if self.headers.get("Authorization") == f"Bearer {self.api_key}":
            return True
        self.error(401, "invalid API key", "authentication_error")
        log("UNAUTHORIZED")
        return False

    def do_GET(self):
        if not self.authorized():
            return
        if self.path.rstrip("/") == "/v1/models":
            self.send_json(200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "owned_by": "fake", "max_model_len": 4096}]})
        else:
            self.error(404, f"no route {self.path}", "not_found")

    def do_POST(self):
        if not self.authorized():
            return
        if self.path.rstrip("/") != "/v1/chat/completions":
            self.error(404, f"no route {self.path}", "not_found")
            return
        length = int(self.headers.get("Content-Length", "0"))
        try:
            req = json.loads(self.rfile.read(length))
        except ValueError:
            self.error(400, "malformed JSON", "invalid_request_error")
            return
        if req.get("model") != MODEL:
            self.error(404, f"The model `{req.get('model')}` does not exist.", "not_found")
            return
        user = [m["content"] for m in req.get("messages", []) if m.get("role") == "user"][-1]
        log("REQUEST", json.dumps(user))
        if "fail" in user:
            self.error(500, "the fake server failed on purpose", "server_error")
            log("FAILED")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        try:
            outcome = self.stream(user, req)
        except (BrokenPipeError, ConnectionResetError):
            outcome = "DISCONNECTED"
        log(outcome)

    def event(self, obj):
        data = obj if isinstance(obj, str) else json.dumps(obj)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def delta(self, delta, finish=None):
        self.event({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": MODEL,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    def stream(self, user, req):
        self.delta({"role": "assistant", "content": ""})
        if "slow" in user:
            time.sleep(30)
            return "SLOW-END"
        if "cut" in user:
            for piece in ANSWER[:4]:
                self.delta({"content": piece})
                time.sleep(0.05)
            return "CUT"
        if "long" in user:
            for i in range(400):
                self.delta({"content": f"word{i} "})
                time.sleep(0.05)
            self.delta({}, "length")
            self.event("[DONE]")
            return "DONE"
        if "inline" in user:
            for piece in ["<thi", "nk>inline ", "thoughts</th", "ink>Inline ", "answer."]:
                self.delta({"content": piece})
                time.sleep(0.05)
        else:
            for piece in REASONING:
                self.delta({"reasoning_content": piece})
                time.sleep(0.15)
            for piece in ANSWER:
                self.delta({"content": piece})
                time.sleep(0.05)
        self.delta({}, "stop")
        if req.get("stream_options", {}).get("include_usage"):
            self.event({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": MODEL,
                        "choices": [],
                        "usage": {"prompt_tokens": 20, "completion_tokens": 22, "total_tokens": 42,
                                  "prompt_tokens_details": {"cached_tokens": 12}},
                        "timings": {"prompt_n": 8, "prompt_ms": 40.0, "prompt_per_second": 200.0,
                                    "predicted_n": 22, "predicted_ms": 1100.0,
                                    "predicted_per_second": 20.0, "cache_n": 12}})
        self.event("[DONE]")
        return "DONE"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--api-key")
    args = ap.parse_args()
    Handler.api_key = args.api_key
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    log("PORT", server.server_address[1])
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
