"""CoordinatorSettings: one model for the coordinator's knobs, in code and in policy files."""

import json
import tomllib

import pydantic
import pytest
import yaml

from marsys_mem import Memory, MemoryConfig, MemoryManager, load_config
from marsys_mem.config import CoordinatorSettings
from marsys_mem.coordination import BranchGraph, Coordinator, InProcessTransport
from marsys_mem.coordination.callbacks import (
    DEFAULT_MAX_CALLBACK_QUEUE,
    DEFAULT_MAX_CALLBACK_TASKS,
)
from marsys_mem.coordination.wire import DEFAULT_MAX_PAYLOAD
from marsys_mem.exceptions import ConfigError
from marsys_mem.patterns import SharedMemoryPool

SECTION = {"heartbeat": 0.1, "gap_timeout": 2.5, "max_log": 500, "max_callback_tasks": 4}


def _graph() -> BranchGraph:
    graph = BranchGraph()
    graph.add_branch("main", agents=["planner"])
    return graph


def test_defaults_are_stated_once():
    settings = CoordinatorSettings()
    assert settings.max_payload == DEFAULT_MAX_PAYLOAD
    assert settings.max_callback_tasks == DEFAULT_MAX_CALLBACK_TASKS
    assert settings.max_callback_queue == DEFAULT_MAX_CALLBACK_QUEUE
    assert MemoryConfig().coordination == settings
    coord = Coordinator(_graph(), pool=SharedMemoryPool())
    assert coord.settings == settings
    assert coord.max_payload == settings.max_payload


def test_the_constructor_takes_the_model_or_a_mapping():
    settings = CoordinatorSettings(**SECTION)
    by_model = Coordinator(_graph(), pool=SharedMemoryPool(), settings=settings)
    by_dict = Coordinator(_graph(), pool=SharedMemoryPool(), settings=SECTION)
    assert by_model.settings is settings
    assert by_dict.settings == settings
    small = InProcessTransport(namespace="tiny", max_payload=1024)
    assert Coordinator(_graph(), transport=small, pool=SharedMemoryPool()).max_payload == 1024


def test_settings_are_frozen():
    settings = CoordinatorSettings()
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        settings.heartbeat = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("knobs", "field", "value"),
    [
        ({"heartbeat": 0}, "heartbeat", "0"),
        ({"gap_timeout": -1.5}, "gap_timeout", "-1.5"),
        ({"max_log": True}, "max_log", "True"),
        ({"max_outbox": "100"}, "max_outbox", "'100'"),
        ({"max_payload": 2.5}, "max_payload", "2.5"),
        ({"heartbeet": 1.0}, "heartbeet", "1.0"),
    ],
)
def test_a_bad_value_names_the_field_and_the_value(knobs, field, value):
    with pytest.raises(pydantic.ValidationError) as info:
        Coordinator(_graph(), pool=SharedMemoryPool(), settings=knobs)
    text = str(info.value)
    assert f"\n{field}\n" in text
    assert f"input_value={value}," in text


def test_settings_of_the_wrong_type_are_refused():
    with pytest.raises(TypeError, match="settings must be a CoordinatorSettings, got str"):
        Coordinator(_graph(), pool=SharedMemoryPool(), settings="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["yaml", "toml", "json"])
def test_the_policy_file_section_is_the_same_model(tmp_path, fmt):
    path = tmp_path / f"policy.{fmt}"
    if fmt == "yaml":
        path.write_text(yaml.safe_dump({"version": 1, "coordination": SECTION}))
    elif fmt == "json":
        path.write_text(json.dumps({"version": 1, "coordination": SECTION}))
    else:
        lines = [f"{k} = {v}" for k, v in SECTION.items()]
        path.write_text("version = 1\n[coordination]\n" + "\n".join(lines) + "\n")
        assert tomllib.loads(path.read_text())["coordination"] == SECTION
    config = load_config(path)
    assert config.coordination == CoordinatorSettings(**SECTION)
    assert isinstance(config.coordination, CoordinatorSettings)


def test_a_bad_value_in_a_file_names_file_line_field_and_value(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\ncoordination:\n  heartbeat: -2\n  max_log: lots\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert "policy.yaml:3: coordination.heartbeat" in text
    assert "(got -2)" in text
    assert "policy.yaml:4: coordination.max_log" in text
    assert "(got 'lots')" in text


def test_an_unknown_knob_in_a_file_is_refused(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\ncoordination:\n  heart_beat: 1\n")
    with pytest.raises(ConfigError, match=r"coordination\.heart_beat"):
        load_config(path)


async def test_the_front_door_coordinates_with_the_config_settings():
    config = MemoryConfig.model_validate({"coordination": SECTION})
    memory = Memory(MemoryManager(config))
    try:
        coordinator = await memory.start()
        assert coordinator.settings == CoordinatorSettings(**SECTION)
    finally:
        await memory.aclose()


def test_the_guide_lists_every_field_with_its_default():
    import pathlib
    import re

    guide = pathlib.Path(__file__).parents[2] / "docs" / "guides" / "coordination.md"
    rows = dict(re.findall(r"^\| `(\w+)` \| ([\d.]+) \|", guide.read_text(), re.M))
    defaults = CoordinatorSettings().model_dump()
    assert rows == {name: str(value) for name, value in defaults.items()}
