import yaml

from marsys_mem import MemoryManager, Message
from marsys_mem.config.load import load_config
from marsys_mem.context.tokens import HeuristicCounter, count_message

CHATTER = [
    "Lovely weather today, isn't it?",
    "I had pasta for lunch again.",
    "The meeting ran late as usual.",
    "Did you see the game last night?",
]


def _config(tmp_path, retention="session", **patterns):
    patterns = patterns or {"embedder": "hashing", "rag": True, "hierarchical": True}
    data = {
        "version": 1,
        "store": {"backend": "sqlite", "path": "m.db"},
        "agents": {
            "assistant": {
                "retention": retention,
                "context": {"max_messages": 8, "max_tokens": 600},
                "patterns": patterns,
            }
        },
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _fill(mem, n=40):
    mem.add(Message.system("You are a helpful assistant."))
    mem.add(Message.user("Remember: my sister Clara lives in Lisbon."))
    for i in range(n):
        mem.add(Message.user(CHATTER[i % len(CHATTER)] + f" ({i})"))


def test_retrieval_block_brings_back_what_the_window_dropped(tmp_path):
    with MemoryManager.from_config(_config(tmp_path)) as manager:
        _fill(manager.memory("assistant"))
        manager.patterns("assistant").flush()
        win = manager.context_for("assistant", query="Where does Clara live?")
        texts = [m.text for m in win.messages]
        assert texts[0] == "You are a helpful assistant."
        blocks = {m.metadata.get("block"): m.text for m in win.messages if m.role == "system"}
        assert "Clara lives in Lisbon" in blocks["retrieval"]
        assert win.tokens <= 600
        assert len(win) <= 8
        assert win.tokens == sum(count_message(HeuristicCounter(), m) for m in win.messages)
        # nothing retrieved is repeated from the window itself
        window_ids = {m.message_id for m in win.messages if m.role != "system"}
        assert all(
            m.text not in blocks["retrieval"] for m in win.messages if m.message_id in window_ids
        )


def test_core_block_keeps_important_messages(tmp_path):
    with MemoryManager.from_config(_config(tmp_path)) as manager:
        mem = manager.memory("assistant")
        _fill(mem)
        hierarchical = manager.patterns("assistant").hierarchical
        assert hierarchical is not None
        assert [m.text for m in hierarchical.core()] == [
            "Remember: my sister Clara lives in Lisbon."
        ]
        win = manager.context_for("assistant")
        assert win.messages[1].metadata.get("block") == "core_memory"
        assert "Clara lives in Lisbon" in win.messages[1].text
        assert all(m.metadata.get("block") != "retrieval" for m in win.messages)  # no query


def test_persistent_patterns_survive_a_restart(tmp_path):
    path = _config(tmp_path, retention="persistent")
    with MemoryManager.from_config(path) as manager:
        _fill(manager.memory("assistant"))
    with MemoryManager.from_config(path) as manager:
        rag = manager.patterns("assistant").rag
        assert rag is not None
        assert len(rag) >= 41
        hits = rag.search("Clara Lisbon", k=1)
        assert "Clara" in hits[0].text
        win = manager.context_for("assistant", query="Where does Clara live?")
        assert any("Lisbon" in m.text for m in win.messages)


def test_runs_are_episodes(tmp_path):
    path = _config(tmp_path, embedder="hashing", episodic=True)
    with MemoryManager.from_config(path) as manager:
        with manager.run("assistant") as run:
            run.input(Message.user("We booked the hotel in Porto for May."))
        with manager.run("assistant") as run2:
            run2.input(Message.user("The car rental is confirmed."))
        episodic = manager.patterns("assistant").episodic
        assert episodic is not None
        episodes = episodic.episodes()
        assert [e.metadata["run_id"] for e in episodes] == [run.run_id, run2.run_id]
        assert all(not e.is_open for e in episodes)
        hits = episodic.recall("hotel Porto", k=1)
        assert "Porto" in hits[0].text


def test_bm25_only_when_no_embedder(tmp_path):
    path = _config(tmp_path, embedder="none", rag=True)
    with MemoryManager.from_config(path) as manager:
        _fill(manager.memory("assistant"))
        win = manager.context_for("assistant", query="Clara Lisbon sister")
        assert any("Lisbon" in m.text for m in win.messages)


def test_patterns_config_errors_name_the_field(tmp_path):
    import pytest

    from marsys_mem.exceptions import ConfigError

    path = tmp_path / "bad.yaml"
    path.write_text("version: 1\nagents: {a: {patterns: {rag: {k: 0}}}}\n")
    with pytest.raises(ConfigError, match=r"agents\.a\.patterns.*k"):
        load_config(path)
    path.write_text("version: 1\nagents: {a: {patterns: {embedder: magic}}}\n")
    with pytest.raises(ConfigError, match="embedder"):
        load_config(path)
