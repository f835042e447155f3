"""A fake OpenAI-compatible server for tests: the real HTTP protocol, scripted replies.

Tests drive pike through the real openai SDK against it, so retries, timeouts, headers
and JSON shapes are exercised as they would be against a provider, with no network.

    fake.script(Reply(status=429), Reply("hello"))   # served in order, then `default`
    fake.handler = lambda body: Reply(...)           # or answer depending on the prompt
    LLMClient(fake.spec("fake-model"))               # 'http://127.0.0.1:PORT/v1#fake-model'
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Reply:
    """One scripted answer. For an error status, `content` (if any) is the error message."""

    content: str = ""
    status: int = 200
    delay_s: float = 0.0  # sleep before answering (to run past a client's timeout)
    prompt_tokens: int = 100
    completion_tokens: int = 50


# OpenAI's error "type" and "code" for the statuses tests use.
_ERROR_KINDS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


class FakeOpenAI:
    """Serves POST {url}/chat/completions on 127.0.0.1 from a daemon thread.

    `requests` holds each request as {"body": parsed JSON, "headers": {lowercase name: value}}.
    `max_in_flight` is the most requests it was answering at one time.
    """

    def __init__(self, default: Reply | None = None) -> None:
        self.default = default if default is not None else Reply(content="ok")
        self.handler: Callable[[dict], Reply] | None = None
        self.requests: list[dict[str, Any]] = []
        self.handler_errors: list[BaseException] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def spec(self, model: str = "fake-model") -> str:
        """A pike model spec pointing at this server."""
        return f"{self.url}#{model}"

    def script(self, *replies: Reply) -> None:
        """Queue replies, served in order before falling back to `default`."""
        with self._lock:
            self._queue.extend(replies)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[Reply, dict]:
        """Record the request, pick its reply, wait its delay; return (reply, JSON body)."""
        with self._lock:
            self.requests.append({"body": body, "headers": headers})
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            queued = self._queue.popleft() if self._queue and self.handler is None else None
        try:
            reply = self._pick(body, queued)
            time.sleep(reply.delay_s)
        finally:
            # Leave the count before the answer is written: once the client has read it,
            # it may send the next request, which must not find this one still counted.
            with self._lock:
                self.in_flight -= 1
        if reply.status != 200:
            return reply, _error_json(reply)
        return reply, self._completion_json(body, reply)

    def _pick(self, body: dict[str, Any], queued: Reply | None) -> Reply:
        if self.handler is None:
            return queued if queued is not None else self.default
        try:
            return self.handler(body)
        except Exception as exc:  # the test's handler is broken: say so in the reply
            self.handler_errors.append(exc)
            return Reply(content=f"fake handler raised {type(exc).__name__}: {exc}", status=500)

    def _completion_json(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-fake-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": reply.content},
                "finish_reason": "stop",
                "logprobs": None,
            }],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            },
        }


def _error_json(reply: Reply) -> dict[str, Any]:
    kind, code = _ERROR_KINDS.get(reply.status, ("server_error", None))
    message = reply.content or f"fake {reply.status} {HTTPStatus(reply.status).phrase}"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _handler_class(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's connection pool expects

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if not self.path.split("?")[0].endswith("/chat/completions"):
                self._send(404, _error_json(Reply(f"no route {self.path}", status=404)))
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(400, _error_json(Reply("body is not JSON", status=400)))
                return
            headers = {name.lower(): value for name, value in self.headers.items()}
            reply, payload = fake._answer(body, headers)
            self._send(reply.status, payload)

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (its timeout)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

    return Handler


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI()
    try:
        yield fake
    finally:
        fake.close()
