import json
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from marsys_mem import MemoryManager, Message
from marsys_mem.config.load import load_config
from marsys_mem.config.models import (
    MemoryConfig,
    RetentionPolicy,
    StoreConfig,
    default_store_path,
    parse_duration,
)
from marsys_mem.exceptions import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "policies"
# the policy files only: a store or an editor's file left in the folder is not an example
EXAMPLE_FILES = sorted(
    p for p in EXAMPLES.iterdir() if p.is_file() and p.suffix in {".yaml", ".yml", ".toml", ".json"}
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("1d12h", timedelta(days=1, hours=12)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("2w", timedelta(weeks=2)),
        ("1.5h", timedelta(minutes=90)),
        (" 2D ", timedelta(days=2)),
        (3600, timedelta(hours=1)),
        (timedelta(days=3), timedelta(days=3)),
    ],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("bad", ["", "30", "30x", "d30", "1d 2", "-1d", "0s", True, None, [1]])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_every_example_policy_file_loads(path):
    cfg = load_config(path)
    assert cfg.version == 1
    assert cfg.source == path.resolve()
    for agent in cfg.agents:
        assert isinstance(cfg.policy_for(agent), RetentionPolicy)


def test_examples_cover_each_retention_kind():
    assert len(EXAMPLE_FILES) >= 3
    kinds = set()
    for path in EXAMPLE_FILES:
        cfg = load_config(path)
        kinds.add(cfg.defaults.retention)
        kinds.update(cfg.policy_for(a).retention for a in cfg.agents)
    assert kinds == {"single_run", "session", "persistent"}


def test_team_example_merges_defaults():
    cfg = load_config(EXAMPLES / "team.yaml")
    researcher = cfg.policy_for("researcher")
    assert researcher.retention == "persistent"
    assert researcher.ttl == timedelta(days=30)
    assert researcher.max_stored_messages == 10000
    # context merged key by key: max_messages from defaults, the rest overridden
    assert researcher.context.max_messages == 50
    assert researcher.context.max_tokens == 4000
    assert researcher.context.strategy == "summarize"
    assert researcher.context.keep_recent == 20
    assert cfg.policy_for("planner").context.max_tokens == 6000
    assert cfg.policy_for("planner").retention == "session"
    assert cfg.policy_for("scratchpad").retention == "single_run"
    assert cfg.policy_for("unknown-agent") == cfg.defaults
    # no path: the user's data folder, never the checkout (issue 11)
    assert cfg.store.resolved_path(cfg.base_dir) == default_store_path()
    assert EXAMPLES.parent.parent not in cfg.store.resolved_path(cfg.base_dir).parents


def test_example_store_paths_stay_out_of_the_checkout(tmp_path, monkeypatch, request):
    """Loading an example policy and writing through it creates nothing in examples/.

    A postgres example takes its DSN from the environment: here, a fresh schema on the
    test session's server (tests/conftest.py).
    """
    monkeypatch.setenv("MARSYS_MEM_HOME", str(tmp_path / "home"))
    before = sorted(EXAMPLES.rglob("*"))
    for path in EXAMPLE_FILES:
        config = load_config(path)
        if config.store.backend == "postgres":
            server = request.getfixturevalue("postgres_server")
            monkeypatch.setenv(config.store.dsn_env, server.create_schema(f"ex_{path.stem}"))
        with MemoryManager.from_config(path) as manager:
            for agent in [*manager.config.agents, "someone"]:
                manager.memory(agent).add(Message.user("hello"))
    assert sorted(EXAMPLES.rglob("*")) == before
    assert (tmp_path / "home" / "memory.db").is_file()


def test_strategy_override_drops_summarize_only_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "version: 1\n"
        "defaults: {context: {strategy: summarize, keep_recent: 5, max_tokens: 900}}\n"
        "agents: {a: {context: {strategy: sliding_window}}}\n"
    )
    policy = load_config(path).policy_for("a")
    assert policy.context.strategy == "sliding_window"
    assert policy.context.keep_recent is None
    assert policy.context.max_tokens == 900


def test_yaml_toml_json_are_equivalent(tmp_path):
    data = {
        "version": 1,
        "store": {"backend": "sqlite", "path": "m.db", "namespace": "ns"},
        "defaults": {"retention": "persistent", "ttl": "12h", "context": {"max_tokens": 100}},
        "agents": {"a": {"retention": "single_run", "max_stored_messages": 5}},
    }
    (tmp_path / "c.json").write_text(json.dumps(data))
    (tmp_path / "c.yaml").write_text(
        "version: 1\nstore: {backend: sqlite, path: m.db, namespace: ns}\n"
        "defaults: {retention: persistent, ttl: 12h, context: {max_tokens: 100}}\n"
        "agents: {a: {retention: single_run, max_stored_messages: 5}}\n"
    )
    (tmp_path / "c.toml").write_text(
        'version = 1\n[store]\nbackend = "sqlite"\npath = "m.db"\nnamespace = "ns"\n'
        '[defaults]\nretention = "persistent"\nttl = "12h"\n[defaults.context]\nmax_tokens = 100\n'
        '[agents.a]\nretention = "single_run"\nmax_stored_messages = 5\n'
    )
    loaded = [load_config(tmp_path / f"c.{ext}") for ext in ("json", "yaml", "toml")]
    assert loaded[0].model_dump() == loaded[1].model_dump() == loaded[2].model_dump()
    assert loaded[0].policy_for("a").ttl == timedelta(hours=12)


def _error_for(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    return message


def test_error_wrong_type(tmp_path):
    msg = _error_for(tmp_path, "a.yaml", "version: 1\nagents: {r: {max_stored_messages: lots}}\n")
    assert "agents.r.max_stored_messages" in msg
    assert "'lots'" in msg


def test_error_unknown_key(tmp_path):
    msg = _error_for(tmp_path, "a.yaml", "version: 1\nagents: {r: {colour: red}}\n")
    assert "agents.r.colour" in msg
    assert "unknown field" in msg
    assert "a.yaml:2:" in msg  # the line it is written on


def test_error_unknown_top_level_key(tmp_path):
    msg = _error_for(tmp_path, "a.yaml", "version: 1\nagentz: {}\n")
    assert "agentz" in msg


def test_error_bad_duration(tmp_path):
    msg = _error_for(tmp_path, "a.yaml", "version: 1\nagents: {r: {ttl: 30x}}\n")
    assert "agents.r.ttl" in msg
    assert "'30x'" in msg


def test_error_unknown_backend(tmp_path):
    msg = _error_for(tmp_path, "a.toml", 'version = 1\n[store]\nbackend = "cassandra"\n')
    assert "store.backend" in msg
    assert "'cassandra'" in msg


def test_error_bad_yaml_names_line(tmp_path):
    msg = _error_for(tmp_path, "a.yaml", "version: 1\nagents:\n  r: {retention: [\n")
    assert "invalid YAML" in msg
    assert "line" in msg


def test_error_bad_toml(tmp_path):
    msg = _error_for(tmp_path, "a.toml", "version = = 1\n")
    assert "invalid TOML" in msg


def test_error_bad_json_names_line(tmp_path):
    msg = _error_for(tmp_path, "a.json", '{"version": 1,\n "agents": }')
    assert "invalid JSON" in msg
    assert "line 2" in msg


def test_error_wrong_version(tmp_path):
    msg = _error_for(tmp_path, "a.yaml", "version: 2\n")
    assert "version" in msg


def test_error_bad_context_merge(tmp_path):
    msg = _error_for(tmp_path, "a.yaml", "version: 1\nagents: {r: {context: {keep_recent: 3}}}\n")
    assert "agents.r.context" in msg
    assert "keep_recent" in msg


def test_error_negative_limit(tmp_path):
    msg = _error_for(tmp_path, "a.yaml", "version: 1\ndefaults: {context: {max_tokens: -5}}\n")
    assert "defaults.context.max_tokens" in msg


def test_error_not_a_mapping(tmp_path):
    msg = _error_for(tmp_path, "a.yaml", "- just\n- a list\n")
    assert "mapping" in msg


def test_error_missing_file_and_unknown_suffix(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    path = tmp_path / "c.ini"
    path.write_text("[x]\n")
    with pytest.raises(ConfigError, match=r"unknown file type '\.ini'"):
        load_config(path)


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("empty.yaml", "", "the file is empty"),
        ("blank.yaml", "\n  \n", "the file is empty"),
        ("comments.yaml", "# version: 1\n", "only comments or null"),
        ("null.json", "null", "only comments or null"),
        ("empty.toml", "# nothing\n", "the file is empty (it sets nothing)"),
    ],
)
def test_empty_file_is_refused(tmp_path, name, text, says):
    # issue 9 item 11: an empty config passed `validate` and gave the defaults silently
    msg = _error_for(tmp_path, name, text)
    assert says in msg


def test_an_explicit_empty_mapping_still_means_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("{}\n")
    assert load_config(path).defaults.retention == "session"


@pytest.mark.parametrize(
    "ttl",
    [".inf", "-.inf", ".nan", "1.0e+300", "9999999999d", "1" + "0" * 400 + "s", "100000000000000"],
    ids=lambda ttl: ttl[:16],
)
def test_huge_or_non_finite_ttl_is_a_config_error(tmp_path, ttl):
    # issue 9 item 11: OverflowError escaped (and the CLI exited 1, not 2)
    msg = _error_for(tmp_path, "a.yaml", f"agents: {{r: {{ttl: {ttl}}}}}\n")
    assert "agents.r.ttl" in msg
    assert len(msg) < 400


@pytest.mark.parametrize(
    "value",
    [float("inf"), float("-inf"), float("nan"), 1e300, 10**30, "9999999999d", "1e999s"],
)
def test_parse_duration_rejects_overflow_with_value_error(value):
    with pytest.raises(ValueError, match="duration") as info:
        parse_duration(value)
    assert not isinstance(info.value, OverflowError)


def test_parse_duration_keeps_the_longest_timedelta():
    assert parse_duration("999999999d") == timedelta(days=999_999_999)


def test_error_messages_never_repeat_a_huge_value(tmp_path):
    # issue 9 item 10: a value's whole repr went into the message (8.7 MB for a bomb)
    huge = "x" * 200_000
    msg = _error_for(tmp_path, "a.yaml", f"defaults: {{retention: {huge}}}\n")
    assert "defaults.retention" in msg
    assert len(msg) < 400
    msg = _error_for(tmp_path, "b.json", json.dumps({"agents": {huge: {"colour": "red"}}}))
    assert "unknown field" in msg
    assert len(msg) < 400


def test_error_messages_list_at_most_fifty_errors(tmp_path):
    # one report format for policy and workflow files: MAX_ERRORS located lines, then a count
    agents = ", ".join(f"a{i}: {{colour: red}}" for i in range(500))
    msg = _error_for(tmp_path, "a.yaml", f"agents: {{{agents}}}\n")
    assert msg.count("unknown field") == 50
    assert "and 450 more errors" in msg
    assert len(msg) < 10_000  # bounded, whatever the file holds


def test_store_config_rules():
    with pytest.raises(ValidationError, match="path is only used"):
        StoreConfig(backend="memory", path="x.db")
    # no path: the user's data folder, whatever the config's folder
    assert StoreConfig(backend="sqlite").resolved_path(Path("/base")) == default_store_path()
    assert StoreConfig(backend="sqlite", path="m.db").resolved_path(Path("/base")) == Path(
        "/base/m.db"
    )
    assert StoreConfig(backend="sqlite", path="/abs/m.db").resolved_path(Path("/b")) == Path(
        "/abs/m.db"
    )


def test_json_schema_is_exported():
    schema = MemoryConfig.model_json_schema()
    assert schema["type"] == "object"
    assert {"version", "store", "defaults", "agents"} <= set(schema["properties"])
    json.dumps(schema)  # serialisable


def test_policy_is_frozen():
    policy = RetentionPolicy()
    with pytest.raises(ValidationError):
        policy.retention = "persistent"  # type: ignore[misc]
