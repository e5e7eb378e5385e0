"""A scripted HTTP server on a free loopback port that speaks the providers' wire formats.

Tests reach the helpers through the ``server`` fixture (``server.Reply``,
``server.chat_completion(...)``: importlib mode cannot import this conftest). Each test
queues replies (status, JSON body or raw text, delay, headers); the server answers
requests in order and records each request (path, headers, JSON body). Stdlib only.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # a dict (sent as JSON) or a str (sent raw)
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class ScriptedServer:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                with server._lock:
                    server.requests.append(
                        Request(
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            json.loads(raw or b"{}"),
                        )
                    )
                    reply = (
                        server.replies.popleft()
                        if server.replies
                        else Reply(599, {"error": {"message": "no scripted reply left"}})
                    )
                if reply.delay:
                    time.sleep(reply.delay)
                data = (
                    reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
                ).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def queue(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    yield srv
    srv.close()


# ------------------------------------------------------------------ wire-format bodies
def chat_completion(
    content: str | None, *, model: str = "local-model", **message: Any
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content, **message},
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    }


def openai_error(message: str, kind: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def anthropic_message(
    *blocks: dict[str, Any], model: str = "claude-test", stop_reason: str = "end_turn"
) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": list(blocks),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 3},
    }


def anthropic_error(message: str, kind: str = "api_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


ScriptedServer.Reply = Reply  # type: ignore[attr-defined]
ScriptedServer.chat_completion = staticmethod(chat_completion)  # type: ignore[attr-defined]
ScriptedServer.openai_error = staticmethod(openai_error)  # type: ignore[attr-defined]
ScriptedServer.anthropic_message = staticmethod(anthropic_message)  # type: ignore[attr-defined]
ScriptedServer.anthropic_error = staticmethod(anthropic_error)  # type: ignore[attr-defined]
