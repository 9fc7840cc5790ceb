"""A local stand-in for the Anthropic Messages API, for tests that use the real SDK.

    with FakeAnthropic() as fake:
        fake.script(Reply.text("...", input_tokens=10), Reply.error(429, retry_after="0"))
        client = anthropic.Anthropic(api_key="k", base_url=fake.base_url)

`POST /v1/messages` is answered from the scripted queue, in order (then from `default`,
else a 500 saying the script ran out); every request's headers and JSON body are
recorded in `requests`. Like the real API at version 2026-10-21, a body with a sampling
parameter (temperature, top_p, top_k) is answered with a 400 invalid_request_error.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                404: "not_found_error", 429: "rate_limit_error", 500: "api_error",
                529: "overloaded_error"}
_SAMPLING = ("temperature", "top_p", "top_k")


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # wait this long before answering (longer than a client timeout)

    @classmethod
    def text(cls, text: str, input_tokens: int = 100, output_tokens: int = 50,
             cache_creation_input_tokens: int | None = None,
             cache_read_input_tokens: int | None = None, model: str = "claude-sonnet-4-5",
             stop_reason: str = "end_turn", delay_s: float = 0.0) -> Reply:
        return cls(200, {
            "id": "msg_fake0123456789", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop_reason, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                      "cache_creation_input_tokens": cache_creation_input_tokens,
                      "cache_read_input_tokens": cache_read_input_tokens},
        }, delay_s=delay_s)

    @classmethod
    def error(cls, status: int, message: str = "fake error", kind: str | None = None,
              retry_after: str | None = None) -> Reply:
        headers = {"retry-after": retry_after} if retry_after is not None else {}
        kind = kind or _ERROR_TYPES.get(status, "api_error")
        return cls(status, {"type": "error", "error": {"type": kind, "message": message}},
                   headers)


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]  # lower-case names
    body: dict[str, Any]


class FakeAnthropic:
    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.default: Reply | None = None
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._queue.extend(replies)

    def start(self) -> FakeAnthropic:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()  # releases handlers still sleeping on a delay
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        if any(key in body for key in _SAMPLING) and \
                headers.get("anthropic-version", "") >= "2026-10-21":
            bad = next(key for key in _SAMPLING if key in body)
            return Reply.error(400, f"{bad}: Extra inputs are not permitted")
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if self.default is not None:
            return self.default
        return Reply.error(500, "fake server: no scripted reply left")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_unparsed": raw.decode(errors="replace")}
                with fake._lock:
                    fake.requests.append(Recorded(self.path, headers, body))
                if self.path.split("?")[0] != "/v1/messages":
                    reply = Reply.error(404, f"fake server: no route {self.path}")
                else:
                    reply = fake._next(body, headers)
                if reply.delay_s and fake._stop.wait(reply.delay_s):
                    return  # the server is closing
                payload = json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.send_header("request-id", f"req_fake{len(fake.requests)}")
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output quiet

        return Handler
