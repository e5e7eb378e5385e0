"""``expect`` checks the answer, ``expect_sent`` the window sent; no answer fails ``expect``.

Issue 28: an echo model answered "You said: Book me a flight." and ``expect: Lisbon`` showed
✓ (Lisbon was in the window sent, not in the answer); with the model server down there was
no answer and it still showed ✓. The model here is the real ``openai`` SDK client talking
to :mod:`marsys_mem.testing.llm_server` on loopback.
"""

from __future__ import annotations

import socket
import textwrap
from pathlib import Path

import pytest

from marsys_mem.cli.main import main
from marsys_mem.testing.llm_server import ScriptedServer, echo_chat
from marsys_mem.workflow import Workflow, run_workflow
from marsys_mem.workflow.models import workflow_schema


@pytest.fixture(autouse=True)
def _data_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MARSYS_MEM_HOME", str(tmp_path_factory.mktemp("marsys-home")))


@pytest.fixture
def server():
    srv = ScriptedServer(echo_chat)
    yield srv
    srv.close()


def _workflow(tmp_path: Path, base_url: str, ask: str) -> Path:
    path = tmp_path / "wf.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            name: flights
            llm: {{model: local-model, base_url: '{base_url}', max_retries: 0, timeout: 5}}
            memory: {{store: {{backend: memory}}}}
            agents: [{{name: assistant, system: You book flights.}}]
            steps:
              - say: {{agent: assistant, text: "I live in Lisbon."}}
              - ask: {ask}
            """
        ).lstrip()
    )
    return path


ASK = '{agent: assistant, question: "Book me a flight.", expect: Lisbon, expect_sent: Lisbon}'


def test_expect_checks_the_answer_and_expect_sent_the_window(tmp_path, server, capsys):
    path = _workflow(tmp_path, f"{server.url}/v1", ASK)
    report = run_workflow(path)
    (ask,) = report.asks
    assert ask.answer == "You said: Book me a flight."
    assert ask.missing == ["Lisbon"]  # sent, but not answered
    assert ask.found_sent == ["Lisbon"]
    assert not ask.ok
    assert not report.ok
    text = report.to_text()
    assert "expect: ✗ 'Lisbon'" in text
    assert "expect_sent: ✓ 'Lisbon'" in text
    assert "FAILED: 1 question(s) did not find what they expected" in text
    assert main(["run", str(path), "-q"]) == 1
    capsys.readouterr()

    answered = _workflow(
        tmp_path,
        f"{server.url}/v1",
        '{agent: assistant, question: "Book me a flight.", expect: flight, expect_sent: Lisbon}',
    )
    report = run_workflow(answered)
    assert report.ok, report.to_text()
    assert report.asks[0].found == ["flight"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed when the socket is: nothing listens there


def test_no_answer_fails_expect(tmp_path):
    path = _workflow(tmp_path, f"http://127.0.0.1:{_closed_port()}/v1", ASK)
    report = run_workflow(path)
    (ask,) = report.asks
    assert ask.answer is None
    assert ask.error is not None
    assert ask.missing == ["Lisbon"]
    assert ask.found == []
    assert ask.found_sent == ["Lisbon"]  # the window did hold it
    assert not report.ok
    assert "expect: ✗ 'Lisbon'  (no answer)" in report.to_text()


def test_offline_expect_checks_the_best_match_not_the_window():
    wf = Workflow.model_validate(
        {
            "memory": {"store": {"backend": "memory"}},
            "agents": [{"name": "a", "system": "You know the sky is green on Mars."}],
            "steps": [
                {"say": {"agent": "a", "text": "The sky is blue on Earth."}},
                {
                    "ask": {
                        "agent": "a",
                        "question": "What colour is the sky on Earth?",
                        "expect": ["blue", "green"],
                        "expect_sent": ["green"],
                    }
                },
            ],
        }
    )
    (ask,) = run_workflow(wf).asks
    assert ask.answer == "The sky is blue on Earth."
    assert ask.found == ["blue"]
    assert ask.missing == ["green"]  # in the system prompt sent, not in the answer
    assert ask.found_sent == ["green"]
    assert not ask.ok


def test_the_schema_documents_both():
    ask = workflow_schema()["$defs"]["AskStep"]["properties"]
    assert "answer" in ask["expect"]["description"]
    assert "window" in ask["expect_sent"]["description"]
