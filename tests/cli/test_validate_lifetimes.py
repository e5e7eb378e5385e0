"""``marsys-mem validate`` says, per agent, how long each kind of its data lives."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from marsys_mem.cli.main import main as cli


def test_validate_states_each_kind_lifetime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    agents = {
        "keeper": {
            "retention": "persistent",
            "ttl": "30d",
            "max_stored_messages": 100,
            "patterns": {
                "rag": {"keep": "archive", "max_stored_messages": 100000, "ttl": "365d"},
                "facts": True,
                "hierarchical": True,
            },
        },
        "chat": {"patterns": {"rag": True}},
    }
    policy.write_text(yaml.safe_dump({"version": 1, "agents": agents}))
    assert cli(["validate", str(policy)]) == 0
    out = capsys.readouterr().out
    assert "keeper (persistent):" in out
    assert "conversation: stored; each message for 30d, the newest 100 kept" in out
    assert "rag entries: an archive beyond the conversation: each entry for 365d" in out
    assert "learned facts: while one of the messages they were learned from remains" in out
    assert "tiers: as long as their message" in out
    assert "chat (session):" in out
    assert out.count("rag entries: as long as their message") == 1


def test_a_rag_bound_without_an_archive_is_refused(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    agents = {"a": {"patterns": {"rag": {"max_stored_messages": 10}}}}
    policy.write_text(yaml.safe_dump({"version": 1, "agents": agents}))
    assert cli(["validate", str(policy)]) == 2
