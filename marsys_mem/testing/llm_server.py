"""A scripted HTTP server on loopback that speaks the OpenAI and Anthropic wire formats.

For tests and examples that run the real ``openai`` / ``anthropic`` SDK clients with no
network and no model: the server answers each POST with the next queued :class:`Reply`
(status, JSON body or raw text, delay, headers), or, when the queue is empty, with what
its ``responder`` makes of the request (default: a 599 error saying no reply is left).
Every request is recorded (path, headers, JSON body). Stdlib only.

The server is as strict as the real APIs (``strict=True``, the default): a request to
``/chat/completions``, ``/messages`` or ``/responses`` that breaks one of the provider's
documented request rules (:mod:`marsys_mem.testing.provider_rules`: a Messages request
whose first message is an assistant's, a tool result away from its call, ...) is answered
with the provider's own 400 ``invalid_request_error`` body, before any queued reply is used,
so a test that sends an invalid request fails as it would against the provider.

:func:`echo_chat` is a responder that answers any Chat Completions request
deterministically (it repeats the last user message), so a chat loop can run against the
server as against a local model. ``python -m marsys_mem.testing.llm_server [port]`` serves
it until interrupted and prints the ``OPENAI_BASE_URL`` to use.

Example:
    >>> import json, urllib.request
    >>> with ScriptedServer(responder=echo_chat) as srv:
    ...     srv.queue(Reply(body=chat_completion("scripted")))
    ...     def ask(text):
    ...         body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    ...         req = urllib.request.Request(srv.url + "/v1/chat/completions",
    ...                                      data=json.dumps(body).encode())
    ...         with urllib.request.urlopen(req) as resp:
    ...             return json.load(resp)["choices"][0]["message"]["content"]
    ...     ask("hi"), ask("I live in Oslo")
    ('scripted', 'You said: I live in Oslo')
    >>> len(srv.requests)
    2
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from marsys_mem.testing.provider_rules import request_violations

__all__ = [
    "Reply",
    "Request",
    "ScriptedServer",
    "anthropic_error",
    "anthropic_message",
    "chat_completion",
    "echo_chat",
    "openai_error",
]


@dataclass
class Reply:
    """One scripted answer.

    Attributes:
        status: the HTTP status.
        body: a dict (sent as JSON) or a str (sent raw, e.g. malformed JSON).
        delay: seconds to wait before answering (to provoke client timeouts).
        headers: extra response headers (e.g. ``retry-after``).

    Example:
        >>> Reply(429, openai_error("slow down", "rate_limit"), headers={"retry-after": "0"}).status
        429
    """

    status: int = 200
    body: Any = None
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    """One recorded request: its path, lower-cased headers and JSON body.

    Example:
        >>> Request("/v1/chat/completions", {}, {"model": "m"}).body["model"]
        'm'
    """

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


Responder = Callable[[Request], Reply]


def _no_reply_left(request: Request) -> Reply:
    return Reply(599, {"error": {"message": f"no scripted reply left for {request.path}"}})


class ScriptedServer:
    """An HTTP server on a free loopback port answering queued replies in order.

    Args:
        responder: makes the reply when the queue is empty (default: a 599 error).
        host: the address to bind (loopback).
        port: the port (0: a free one).
        strict: answer a request that breaks its provider's request rules with the
            provider's 400 error (recorded, and no queued reply used); ``False`` accepts
            whatever it is sent.

    Example:
        >>> srv = ScriptedServer()
        >>> srv.url.startswith("http://127.0.0.1:")
        True
        >>> srv.strict
        True
        >>> srv.close()
    """

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        strict: bool = True,
    ) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Request] = []
        self.responder: Responder = responder or _no_reply_left
        self.strict = strict
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"raw": raw.decode("utf-8", "replace")}
                request = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                refused = server._refusal(request)
                with server._lock:
                    server.requests.append(request)
                    queued = None
                    if refused is None and server.replies:
                        queued = server.replies.popleft()
                reply = refused or queued or server.responder(request)
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

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port: int = int(self.httpd.server_address[1])
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def _refusal(self, request: Request) -> Reply | None:
        """The provider's 400 for a request that breaks its rules (``None``: accepted)."""
        if not self.strict:
            return None
        if not isinstance(request.body, dict) or list(request.body) == ["raw"]:  # not JSON
            return None
        found = request_violations(request.path, request.body)
        if not found:
            return None
        return Reply(found[0].status, found[0].error_body())

    def queue(self, *replies: Reply) -> None:
        """Queue replies, answered in order before the responder is asked."""
        with self._lock:
            self.replies.extend(replies)

    def close(self) -> None:
        """Stop serving and free the port. Idempotent."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# ------------------------------------------------------------------ wire-format bodies
def chat_completion(
    content: str | None, *, model: str = "local-model", **message: Any
) -> dict[str, Any]:
    """A Chat Completions response body with one choice (extra ``message`` fields as given).

    Example:
        >>> chat_completion("hi")["choices"][0]["message"]
        {'role': 'assistant', 'content': 'hi'}
    """
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
    """An OpenAI error body.

    Example:
        >>> openai_error("boom")["error"]["message"]
        'boom'
    """
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def anthropic_message(
    *blocks: dict[str, Any], model: str = "claude-test", stop_reason: str = "end_turn"
) -> dict[str, Any]:
    """An Anthropic Messages response body with the given content blocks.

    Example:
        >>> anthropic_message({"type": "text", "text": "hi"})["content"][0]["text"]
        'hi'
    """
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
    """An Anthropic error body.

    Example:
        >>> anthropic_error("overloaded", "overloaded_error")["error"]["type"]
        'overloaded_error'
    """
    return {"type": "error", "error": {"type": kind, "message": message}}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def echo_chat(request: Request) -> Reply:
    """A responder for Chat Completions: ``"You said: <last user message>"``, deterministic.

    Example:
        >>> body = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
        ...                                    {"role": "user", "content": "hello"}]}
        >>> echo_chat(Request("/v1/chat/completions", {}, body)).body["choices"][0]["message"]
        {'role': 'assistant', 'content': 'You said: hello'}
    """
    messages = request.body.get("messages") or []
    last = next(
        (_text_of(m.get("content")) for m in reversed(messages) if m.get("role") == "user"),
        "",
    )
    model = str(request.body.get("model") or "local-model")
    return Reply(body=chat_completion(f"You said: {last}", model=model))


def main(argv: list[str] | None = None) -> int:
    """Serve :func:`echo_chat` on loopback until interrupted (``[port]``, default 8765).

    ``--help`` says how; a bad port is a usage error (exit code 2), as argparse makes it.
    """
    parser = argparse.ArgumentParser(
        prog="python -m marsys_mem.testing.llm_server",
        description=(
            "A scripted OpenAI-compatible chat server on loopback that answers every Chat "
            "Completions request with 'You said: <the last user message>' (no model, no "
            "network). It prints the OPENAI_BASE_URL to use, and serves until interrupted."
        ),
    )
    parser.add_argument(
        "port",
        nargs="?",
        type=_port,
        default=8765,
        help="the loopback port to listen on (default 8765; 0 picks a free one)",
    )
    args = parser.parse_args(argv)
    with ScriptedServer(echo_chat, port=args.port) as srv:
        print(f"export OPENAI_BASE_URL={srv.url}/v1 OPENAI_API_KEY=unused", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


def _port(value: str) -> int:
    """A port number 0-65535 (argparse type)."""
    if not value.isdigit() or int(value) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {value!r}")
    return int(value)


if __name__ == "__main__":
    raise SystemExit(main())
