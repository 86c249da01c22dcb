"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1 (port 0), for tests."""

from __future__ import annotations

import collections
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion(content, usage=(11, 5)):
    body = {"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
    if usage is not None:
        body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return body


GOOD = completion('{"success": true, "reason": "the carrot is on the counter"}')


class Endpoint:
    """A scripted OpenAI-compatible server: each request pops the next (status, body, delay);
    when the script is empty it answers GOOD."""

    def __init__(self):
        self.script = collections.deque()
        self.received = []
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with endpoint.lock:
                    # the headers as received (an email.message.Message): names are looked up
                    # case-insensitively, as HTTP has them (httpx, under openai, sends them in
                    # lower case)
                    endpoint.received.append({"path": self.path, "headers": self.headers, "body": json.loads(raw)})
                    status, body, delay = endpoint.script.popleft() if endpoint.script else (200, GOOD, 0.0)
                time.sleep(delay)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and went away

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def push(self, status=200, body=GOOD, delay=0.0):
        self.script.append((status, body, delay))

    @property
    def count(self):
        with self.lock:
            return len(self.received)

    def close(self):
        self.server.shutdown()
        self.server.server_close()
