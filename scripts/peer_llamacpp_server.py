#!/usr/bin/env python3
"""The peer for `sluice bench serve --peer llama-cpp`: llama-cpp-python's
OpenAI-compatible server on the same GGUF.

    scripts/peer_llamacpp_server.py -m MODEL [--host H] [--port P]
                                    [-c CTX] [-t THREADS]

Uses llama_cpp.server (pip install 'llama-cpp-python[server]') when its
dependencies are installed. Without them it serves the same routes itself
with the standard library: GET /health, GET /v1/models, POST /v1/completions
and /v1/chat/completions (streaming as SSE and not), each answered by
llama_cpp.Llama's own OpenAI-shaped create_completion /
create_chat_completion, one request at a time (llama-cpp-python's server
also serializes requests on its one context). Prints "peer: serving ..." on
stderr when ready.
"""
import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument("-c", "--ctx", type=int, default=2048)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--model-name", default=None)
    ap.add_argument("--fallback", action="store_true",
                    help="use the standard-library server even when "
                         "llama_cpp.server is available")
    return ap.parse_args()


def run_official(a, name):
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings
    app = create_app(
        server_settings=ServerSettings(host=a.host, port=a.port),
        model_settings=[ModelSettings(model=a.model, model_alias=name,
                                      n_ctx=a.ctx, n_threads=a.threads,
                                      n_threads_batch=a.threads,
                                      verbose=False)])
    print("peer: serving %s at http://%s:%d (llama_cpp.server)" %
          (name, a.host, a.port), file=sys.stderr, flush=True)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning")


def run_fallback(a, name):
    from llama_cpp import Llama
    llm = Llama(model_path=a.model, n_ctx=a.ctx, n_threads=a.threads,
                n_threads_batch=a.threads, verbose=False)
    lock = threading.Lock()
    keys = {"max_tokens", "temperature", "top_p", "stop", "seed", "stream",
            "logprobs", "top_logprobs", "presence_penalty",
            "frequency_penalty"}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send_json(self, code, obj):
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self.send_json(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self.send_json(200, {"object": "list", "data": [
                    {"id": name, "object": "model", "owned_by": "peer"}]})
            else:
                self.send_json(404, {"error": {"message": "not found"}})

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(n))
            except ValueError:
                return self.send_json(400, {"error": {"message": "bad json"}})
            kw = {k: v for k, v in req.items() if k in keys}
            stream = bool(kw.get("stream"))
            if self.path == "/v1/completions":
                call = lambda: llm.create_completion(  # noqa: E731
                    prompt=req.get("prompt", ""), **kw)
            elif self.path == "/v1/chat/completions":
                call = lambda: llm.create_chat_completion(  # noqa: E731
                    messages=req.get("messages", []), **kw)
            else:
                return self.send_json(404, {"error": {"message": "not found"}})
            with lock:
                if not stream:
                    return self.send_json(200, call())
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def chunk(b):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
                    self.wfile.flush()
                for part in call():
                    chunk(b"data: " + json.dumps(part).encode() + b"\n\n")
                chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")

    class Server(ThreadingHTTPServer):
        # socketserver's default backlog of 5 drops connections when 16
        # clients connect at once (the benchmark's N = 16)
        request_queue_size = 128
        daemon_threads = True

    srv = Server((a.host, a.port), Handler)
    print("peer: serving %s at http://%s:%d (fallback)" %
          (name, a.host, a.port), file=sys.stderr, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


def main():
    a = parse_args()
    name = a.model_name or os.path.basename(a.model).rsplit(".gguf", 1)[0]
    if not a.fallback:
        try:
            import llama_cpp.server.app  # noqa: F401
            import uvicorn  # noqa: F401
        except ImportError:
            a.fallback = True
    (run_fallback if a.fallback else run_official)(a, name)


if __name__ == "__main__":
    main()
