"""The ``server`` fixture: a scripted loopback server speaking the providers' wire formats.

The server lives in :mod:`marsys_mem.testing.llm_server` (public, stdlib only; the README
tests use it too). Tests reach its helpers through the fixture (``server.Reply``,
``server.chat_completion(...)``: importlib mode cannot import this conftest). Each test
queues replies (status, JSON body or raw text, delay, headers); the server answers
requests in order and records each request (path, headers, JSON body).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from marsys_mem.testing.llm_server import (
    Reply,
    ScriptedServer,
    anthropic_error,
    anthropic_message,
    chat_completion,
    openai_error,
)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    yield srv
    srv.close()


ScriptedServer.Reply = Reply  # type: ignore[attr-defined]
ScriptedServer.chat_completion = staticmethod(chat_completion)  # type: ignore[attr-defined]
ScriptedServer.openai_error = staticmethod(openai_error)  # type: ignore[attr-defined]
ScriptedServer.anthropic_message = staticmethod(anthropic_message)  # type: ignore[attr-defined]
ScriptedServer.anthropic_error = staticmethod(anthropic_error)  # type: ignore[attr-defined]
