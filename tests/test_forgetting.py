"""Retention and forget reach every record derived from a message (issue 24's six cases).

Each test is one case that failed before records had owners: ttl, the bound, forget by a
recall hit's id, learned facts, shared facts over MCP, and two processes on one store.
Stores are real SQLite files; "no file holds it" greps the store's folder (WAL included).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from marsys_mem import MemoryManager, Message
from marsys_mem.config import load_config
from marsys_mem.integrations.mcp import MemoryServer
from marsys_mem.store.keys import internal_key


def _policy(tmp_path: Path, **agent: Any) -> Path:
    data = {
        "version": 1,
        "store": {"backend": "sqlite", "path": str(tmp_path / "store" / "memory.db")},
        "agents": {"a": {"retention": "persistent", **agent}},
    }
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _files_holding(folder: Path, text: str) -> list[str]:
    """Files under ``folder`` whose bytes contain ``text`` (UTF-8).

    ``text`` must not look like hex: message ids are, and would match by chance.
    """
    needle = text.encode()
    return [str(p) for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _window_text(manager: MemoryManager, agent: str, query: str | None = None) -> str:
    return "\n".join(m.text for m in manager.context_for(agent, query).messages)


def test_ttl_reaches_the_rag_copy(tmp_path: Path) -> None:
    """Case 1: after the ttl, the RAG copy, its vector and the text on disk are gone."""
    policy = _policy(tmp_path, ttl="1h", patterns={"embedder": "hashing", "rag": True})
    old = datetime.now(UTC) - timedelta(hours=2)
    with MemoryManager.from_config(policy) as manager:
        mem = manager.memory("a")
        mem.add(Message.user("SECRET-TTL my card PIN is 9876", timestamp=old))
        mem.add(Message.user("what is the weather like"))
        manager.flush()
        manager.apply_retention()
        rag_key = internal_key(manager.key("a"), "rag")
        assert manager.store.count_messages(manager.key("a")) == 1
        assert manager.store.count_messages(rag_key) == 1
        assert "9876" not in _window_text(manager, "a", "what is my card PIN")
    with MemoryManager.from_config(policy) as manager:  # a restart
        assert "9876" not in _window_text(manager, "a", "what is my card PIN")
        hits = manager.patterns("a").search_all("card PIN")  # type: ignore[union-attr]
        assert all("9876" not in h.message.text for h in hits)
    assert _files_holding(tmp_path / "store", "SECRET-TTL") == []


def test_the_bound_bounds_the_rag_copy(tmp_path: Path) -> None:
    """Case 2: max_stored_messages bounds the RAG copy; recall finds only what is kept."""
    policy = _policy(
        tmp_path, max_stored_messages=50, patterns={"embedder": "hashing", "rag": True}
    )
    with MemoryManager.from_config(policy) as manager:
        mem = manager.memory("a")
        for i in range(500):
            mem.add(Message.user(f"note number {i} about topic{i}"))
        manager.flush()
        key = manager.key("a")
        assert manager.store.count_messages(key) == 50
        assert manager.store.count_messages(internal_key(key, "rag")) == 50
        # (a kept note: the default min_score leaves out notes that only share "note")
        hits = manager.patterns("a").search_all("note about topic480")  # type: ignore[union-attr]
        kept = {m.message_id for m in manager.store.load_messages(key)}
        assert hits
        assert all(h.message.message_id in kept for h in hits)


def test_forget_by_the_id_recall_returned(tmp_path: Path) -> None:
    """Case 3: an archive keeps what the conversation dropped; forget by a hit's id works."""
    policy = _policy(
        tmp_path,
        max_stored_messages=5,
        patterns={"embedder": "hashing", "rag": {"keep": "archive", "max_stored_messages": 100}},
    )
    with MemoryManager.from_config(policy) as manager:
        mem = manager.memory("a")
        mem.add(Message.user("my locker code is LOCKER-4711"))
        for i in range(20):
            mem.add(Message.user(f"small talk {i}"))
        manager.flush()
        patterns = manager.patterns("a")
        assert patterns is not None
        hit = patterns.search_all("locker code")[0]
        assert "4711" in hit.message.text
        assert hit.message.message_id not in mem
        removed = manager.forget("a", message_ids=[hit.message.message_id])
        assert [m.text for m in removed] == ["my locker code is LOCKER-4711"]
        assert all("4711" not in h.message.text for h in patterns.search_all("locker code"))
    assert _files_holding(tmp_path / "store", "LOCKER-4711") == []


def test_facts_learned_from_a_forgotten_message_go(tmp_path: Path) -> None:
    """Case 4: forget(everything) deletes the facts learned from those messages."""
    policy = _policy(
        tmp_path,
        patterns={"embedder": "hashing", "facts": {"subject": "alice", "debounce": 30}},
    )
    with MemoryManager.from_config(policy) as manager:
        mem = manager.memory("a")
        mem.add(Message.user("Hi, my name is ZORGLUBSECRET."))
        manager.flush()
        assert "ZORGLUBSECRET" in _window_text(manager, "a")
        mem.add(Message.user("And my name is ZORGLUBOTHER too."))  # still being learned
        manager.forget("a", everything=True)
        assert "ZORGLUB" not in _window_text(manager, "a")
    with MemoryManager.from_config(policy) as manager:
        assert "ZORGLUB" not in _window_text(manager, "a")
        assert manager.fact_memory("hashing").facts("alice") == []
    assert _files_holding(tmp_path / "store", "ZORGLUB") == []


def test_a_fact_with_another_source_left_stays(tmp_path: Path) -> None:
    """A fact restated in two messages survives forgetting one of them, not both."""
    policy = _policy(
        tmp_path,
        patterns={"embedder": "hashing", "facts": {"subject": "alice", "debounce": 30}},
    )
    with MemoryManager.from_config(policy) as manager:
        mem = manager.memory("a")
        first = mem.add(Message.user("I live in Lisbon."))
        second = mem.add(Message.user("As I said, I live in Lisbon."))
        manager.flush()
        facts = manager.fact_memory("hashing")
        assert [f.text for f in facts.facts("alice")] == ["User lives in Lisbon"]
        manager.forget("a", message_ids=[first])
        assert [f.text for f in facts.facts("alice")] == ["User lives in Lisbon"]
        manager.forget("a", message_ids=[second])
        assert facts.facts("alice") == []


async def test_shared_facts_are_forgotten_over_mcp(tmp_path: Path) -> None:
    """Case 5: forget(everything) over MCP removes the agent's shared facts, for good."""
    policy = _policy(tmp_path)
    server = MemoryServer.from_config(policy)
    try:
        server.remember("a", "The budget is SECRETBUDGET", kind="fact")
        await server.share_fact("a", "The launch is SECRETLAUNCH", scope="global")
        result = await server.aforget("a", everything=True)
        assert result["facts_removed"] == 2
        assert server.manager.shared.facts() == []
    finally:
        await server.aclose()
    server = MemoryServer.from_config(policy)  # a restart
    try:
        window = await server.acontext("a")
        assert "SECRET" not in str(window)
    finally:
        await server.aclose()
    assert _files_holding(tmp_path / "store", "SECRETBUDGET") == []


async def test_shared_facts_forgotten_by_id(tmp_path: Path) -> None:
    """A shared fact is forgotten by id; the others stay."""
    server = MemoryServer.from_config(_policy(tmp_path))
    try:
        keep = await server.share_fact("a", "Hotels cost 140 EUR", scope="global")
        drop = await server.share_fact("a", "The door code is 2468", scope="global")
        result = await server.aforget("a", fact_ids=[drop["id"]])
        assert result["facts_removed"] == 1
        assert [f.id for f in server.manager.shared.facts()] == [keep["id"]]
    finally:
        await server.aclose()


def test_two_processes_on_one_store_are_one_memory(tmp_path: Path) -> None:
    """Case 6: what one manager forgets, the other stops serving; each sees the other's writes."""
    policy = _policy(tmp_path, patterns={"embedder": "hashing", "rag": True})
    config = load_config(policy)
    with MemoryManager(config) as a, MemoryManager(config) as b:
        a.memory("a").add(Message.user("my locker code is 4711"))
        assert "4711" in _window_text(b, "a", "locker code")
        b.memory("a").add(Message.user("the parcel arrives on Friday"))
        assert "Friday" in _window_text(a, "a")
        a.forget("a", everything=True)
        assert "4711" not in _window_text(b, "a", "locker code")
        assert "Friday" not in _window_text(b, "a", "parcel")
        rag_key = internal_key(a.key("a"), "rag")
        assert a.store.count_messages(rag_key) == 0


def test_two_mcp_servers_on_one_policy_file_are_one_memory(tmp_path: Path) -> None:
    """Case 6 over MCP: what server A forgets, server B no longer recalls or lists."""
    policy = _policy(tmp_path)
    a, b = MemoryServer.from_config(policy), MemoryServer.from_config(policy)
    try:
        a.remember("a", "my locker code is 4711")
        b.remember("a", "the parcel arrives on Friday")
        assert {m["content"] for m in b.messages("a")} >= {"my locker code is 4711"}
        assert "Friday" in str(a.recall("a", "parcel")["hits"])
        a.forget("a", everything=True)
        assert "4711" not in str(b.recall("a", "locker code")["hits"])
        assert b.messages("a") == []
    finally:
        a.close()
        b.close()


def test_the_cli_forgets_messages_and_shared_facts(tmp_path: Path) -> None:
    """``marsys-mem forget``: messages with what was derived from them, shared facts."""
    from marsys_mem.cli.main import main as cli
    from marsys_mem.model.facts import fact_message
    from marsys_mem.store.keys import facts_key

    policy = _policy(tmp_path, patterns={"embedder": "hashing", "rag": True})
    with MemoryManager.from_config(policy) as manager:
        mid = manager.memory("a").add(Message.user("my locker code is LOCKER-4711"))
        fact = manager.shared.share_insight("a", "The door code is DOOR-2468")
        manager.store.append_messages(facts_key(manager.namespace, "main"), [fact_message(fact)])
    assert cli(["forget", "--config", str(policy)]) == 2  # nothing named
    assert cli(["forget", "--config", str(policy), "--everything"]) == 2  # no agent
    assert cli(["forget", "--config", str(policy), "--agent", "a", "--message-id", mid]) == 0
    assert cli(["forget", "--config", str(policy), "--sharer", "a"]) == 0
    assert _files_holding(tmp_path / "store", "LOCKER-4711") == []
    assert _files_holding(tmp_path / "store", "DOOR-2468") == []


def test_copies_an_earlier_version_kept_go_on_opening(tmp_path: Path) -> None:
    """A store written before ownership holds RAG copies of messages long gone (5,000
    copies for a bound of 50): the first read after the upgrade drops them."""
    policy = _policy(
        tmp_path, max_stored_messages=5, patterns={"embedder": "hashing", "rag": True}
    )
    with MemoryManager.from_config(policy) as manager:
        key = manager.key("a")
        rag_key = internal_key(key, "rag")
        old = [Message.user(f"old note {i} SECRETOLD") for i in range(20)]
        manager.store.append_messages(rag_key, old)  # unlinked, as an earlier version wrote
        manager.store.append_messages(key, old[-5:])
    with MemoryManager.from_config(policy) as manager:
        hits = manager.patterns("a").search_all("old note")  # type: ignore[union-attr]
        assert {h.message.message_id for h in hits} <= {m.message_id for m in old[-5:]}
        assert manager.store.count_messages(rag_key) == 5


def test_ttl_is_a_hard_lifetime_between_retention_passes(tmp_path: Path) -> None:
    """No read returns an expired message, whenever retention last ran (and on opening)."""
    import time

    policy = _policy(tmp_path, ttl=1, patterns={"embedder": "hashing", "rag": True})
    with MemoryManager.from_config(policy) as manager:
        manager.memory("a").add(Message.user("SECRETSHORT my card PIN is 9876"))
        assert "9876" in _window_text(manager, "a", "card PIN")
        time.sleep(1.2)
        assert "9876" not in _window_text(manager, "a", "card PIN")  # no retention call
    with MemoryManager.from_config(policy) as manager:
        manager.memory("a").add(Message.user("SECRETOPEN my other PIN is 5555"))
    time.sleep(1.2)
    with MemoryManager.from_config(policy) as manager:  # a restart after the ttl
        assert "5555" not in _window_text(manager, "a", "other PIN")
        assert manager.store.count_messages(internal_key(manager.key("a"), "rag")) == 0
