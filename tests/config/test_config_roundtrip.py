"""A MemoryConfig written out by pydantic (``model_dump_json``, ``model_dump``) loads again.

pydantic writes a ``timedelta`` as an ISO 8601 duration (``PT2S``, ``P30D``); the
duration parser reads those beside ``30d``, and the JSON Schema accepts them too. A dump
also spells out every default, which the store section must accept for any backend.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from marsys_mem import MemoryConfig, RetentionPolicy, load_config
from marsys_mem.config.models import parse_duration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [*sorted((ROOT / "examples" / "policies").iterdir()), ROOT / "examples/mcp/policy.yaml"]
SCHEMA = jsonschema.Draft202012Validator(MemoryConfig.model_json_schema())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PT2S", timedelta(seconds=2)),
        ("P30D", timedelta(days=30)),
        ("P1DT12H", timedelta(days=1, hours=12)),
        ("PT1H30M", timedelta(minutes=90)),
        ("P2W", timedelta(weeks=2)),
        ("PT0.001S", timedelta(milliseconds=1)),
        (" pt45s ", timedelta(seconds=45)),
        ("P2739726Y9DT23H59M59.999999S", timedelta.max),
    ],
)
def test_iso_8601_durations_are_read(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected
    assert not list(SCHEMA.iter_errors({"defaults": {"ttl": text}}))


@pytest.mark.parametrize("bad", ["P", "PT", "PT2", "-PT2S", "PT0S", "P1X", "PT2S2"])
def test_bad_iso_durations_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_a_dumped_config_loads_again() -> None:
    config = MemoryConfig.model_validate(
        {
            "store": {"backend": "sqlite", "path": "memory.db"},
            "agents": {
                "researcher": {"retention": "persistent", "ttl": "2s"},
                "writer": {"retention": "persistent", "ttl": "30d", "max_stored_messages": 10},
            },
        }
    )
    dumped = config.model_dump_json()
    assert '"ttl":"PT2S"' in dumped
    again = MemoryConfig.model_validate_json(dumped)
    assert again == config
    assert again.agents["researcher"].ttl == timedelta(seconds=2)
    assert not list(SCHEMA.iter_errors(json.loads(dumped)))  # editors accept it too
    # the same through a YAML file
    assert MemoryConfig.model_validate(yaml.safe_load(yaml.safe_dump(json.loads(dumped)))) == config


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_file_round_trips(path: Path) -> None:
    config = load_config(path)
    again = MemoryConfig.model_validate_json(config.model_dump_json())
    assert again.model_dump() == config.model_dump()  # (the loaded one knows its file)
    assert not list(SCHEMA.iter_errors(json.loads(config.model_dump_json())))


@settings(max_examples=200, deadline=None)
@given(
    ttl=st.timedeltas(min_value=timedelta(microseconds=1), max_value=timedelta.max),
    kept=st.none() | st.integers(min_value=1, max_value=10**9),
    backend=st.sampled_from(["memory", "sqlite", "postgres"]),
)
def test_any_ttl_round_trips(ttl: timedelta, kept: int | None, backend: str) -> None:
    store: dict[str, object] = {"backend": backend}
    if backend == "sqlite":
        store["path"] = "m.db"
    config = MemoryConfig.model_validate(
        {
            "store": store,
            "defaults": {"retention": "persistent", "ttl": ttl},
            "agents": {"a": {"ttl": ttl, "max_stored_messages": kept}},
        }
    )
    assert MemoryConfig.model_validate_json(config.model_dump_json()) == config
    assert MemoryConfig.model_validate(config.model_dump(mode="json")) == config
    policy = config.policy_for("a")
    assert RetentionPolicy.model_validate_json(policy.model_dump_json()) == policy


def test_a_postgres_setting_on_another_backend_is_still_refused() -> None:
    with pytest.raises(ValueError, match="dsn_env is only used by backend 'postgres'"):
        MemoryConfig.model_validate({"store": {"backend": "sqlite", "dsn_env": "MY_DSN"}})
    with pytest.raises(ValueError, match="connect_timeout is only used"):
        MemoryConfig.model_validate({"store": {"connect_timeout": 3}})
