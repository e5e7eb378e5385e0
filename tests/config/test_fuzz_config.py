"""Fuzz the config-file reader: retention-policy files in YAML, TOML and JSON.

Every file must give a :class:`~marsys_mem.exceptions.ConfigError` (whose message names the
file and stays short) or a valid config, never a raw exception, and never take over a
second. Inputs: config-shaped data with hostile values in every slot, written in each
format; text built from YAML's syntax (anchors, aliases, merge keys, tags, brackets,
indentation); raw bytes; alias bombs of every shape; deep nesting. Each input goes
through ``load_config`` (the library) and ``validate_config_file`` (``marsys-mem
validate``), and its text through ``load_with_lines`` (the workflow reader).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marsys_mem.config.load import load_config
from marsys_mem.config.models import MemoryConfig
from marsys_mem.config.sourcemap import load_with_lines
from marsys_mem.exceptions import ConfigError
from marsys_mem.workflow import validate_config_file

LIMIT_S = 2.0  # CPU seconds of this process (process_time); the heaviest case takes ~0.5 s quiet
MAX_MESSAGE = 8_000  # at most 20 errors are listed, each with short values
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
EXTS = (".yaml", ".json", ".toml")


def _timed(call: Callable[[], Any]) -> Any:
    """Run ``call``: a result or a short ConfigError, within the time limit."""
    started = time.process_time()
    try:
        result = call()
    except ConfigError as exc:
        message = str(exc)
        assert message, "an empty error message"
        assert len(message) < MAX_MESSAGE, len(message)
        result = exc
    elapsed = time.process_time() - started
    assert elapsed < LIMIT_S, f"{elapsed:.2f} s"
    return result


def check_file(path: Path) -> None:
    """The library, the CLI's validator and the workflow reader on one file."""
    result = _timed(lambda: load_config(path))
    if isinstance(result, ConfigError):
        assert str(result).startswith(str(path)), str(result)[:200]
    else:
        assert isinstance(result, MemoryConfig)
        for agent in result.agents:
            result.policy_for(agent)
    _timed(lambda: validate_config_file(path))
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return
    _timed(lambda: load_with_lines(text, name=path.name))


def check_text(text: str | bytes, ext: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"fuzz{ext}"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8", errors="surrogatepass")
        check_file(path)


# ---------------------------------------------------------------------------- writers
def to_toml(data: dict[Any, Any]) -> str:
    """A minimal TOML writer (inline tables) for fuzz data; None becomes ``""``."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            if math.isnan(v):
                return "nan"
            if math.isinf(v):
                return "inf" if v > 0 else "-inf"
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(str(k))} = {value(x)}" for k, x in v.items()) + "}"
        return json.dumps("" if v is None else str(v))

    return "".join(f"{json.dumps(str(k))} = {value(v)}\n" for k, v in data.items())


def write(data: Any, ext: str) -> str:
    if ext == ".json":
        return json.dumps(data)
    if ext == ".toml":
        return to_toml(data if isinstance(data, dict) else {"value": data})
    return yaml.safe_dump(data, allow_unicode=True)


# ---------------------------------------------------------------------------- strategies
text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "\x00", "\t", "ключ", "😀", "\u2028", "a" * 5000]),
)
huge_int = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**63 - 1, 2**63, -(2**63) - 1, 10**400, 0, -1]),
)
duration = st.one_of(
    st.sampled_from(["30d", "1d12h", "0s", "-1d", "1e400s", "9999999999d", "999999999d", "2w"]),
    st.builds(lambda n, u: f"{n}{u}", huge_int, st.sampled_from("smhdwx")),
    st.floats(),
    huge_int,
)
weird = st.one_of(
    st.none(),
    st.booleans(),
    huge_int,
    st.floats(),
    text,
    duration,
    st.lists(st.integers(), max_size=3),
    st.dictionaries(text, st.integers(), max_size=2),
)


def choice(*good: Any) -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(good), weird)


context = st.fixed_dictionaries(
    {},
    optional={
        "max_messages": choice(1, 50),
        "max_tokens": choice(100, 8000),
        "strategy": choice("sliding_window", "trim_oldest", "summarize"),
        "keep_recent": choice(2, 20),
        "summary_max_tokens": choice(200),
        "colour": weird,
    },
)
patterns = st.fixed_dictionaries(
    {},
    optional={
        "embedder": choice("default", "hashing", "none"),
        "rag": st.one_of(st.booleans(), st.fixed_dictionaries({}, optional={"k": choice(4)})),
        "episodic": choice(True, False),
        "hierarchical": st.one_of(
            st.booleans(),
            st.fixed_dictionaries({}, optional={"core_threshold": choice(0.5, 0.8)}),
        ),
        "budget": st.fixed_dictionaries({}, optional={"retrieval": choice(0.3, 0.5)}),
    },
)
policy = st.fixed_dictionaries(
    {},
    optional={
        "retention": choice("single_run", "session", "persistent"),
        "ttl": duration,
        "max_stored_messages": choice(1, 100, 10_000),
        "context": st.one_of(context, weird),
        "patterns": st.one_of(patterns, weird),
    },
)
config = st.fixed_dictionaries(
    {},
    optional={
        "version": choice(1, 2),
        "store": st.fixed_dictionaries(
            {},
            optional={
                "backend": choice("memory", "sqlite"),
                "path": choice("m.db", "/tmp/x/m.db"),
                "namespace": choice("default", "team", "", "a#b"),
            },
        ),
        "defaults": st.one_of(policy, weird),
        "agents": st.one_of(
            st.dictionaries(
                st.one_of(text, st.sampled_from(["researcher", "r"])), policy, max_size=3
            ),
            weird,
        ),
        "extra": weird,
    },
)

# YAML made of its own syntax: anchors, aliases, merges, tags, flow and block collections.
yaml_token = st.sampled_from(
    [
        "a", "b", "version", "agents", "defaults", "ttl", "retention", "1", "-1", ".inf",
        ".nan", "0x1F", "1:30", "2024-13-01", "2024-01-01", "~", "null", "true", "yes",
        "9" * 40, "1e400", "'q'", '"\\udc80"', '"x"', ": ", ":", "- ", "-", "[", "]", "{",
        "}", ", ", "&a ", "&b ", "*a", "*b", "<<: ", "<<: *a", "!!str ", "!!int ", "!!set ",
        "!!binary ", "!!python/name:os.system ", "!x ", "? ", "|", ">", "#", "---", "...",
        "%YAML 1.1", "\n", "\n  ", "\n    ", "\t", " ", "\x00", "\ufeff", "é", "\u2028",
    ]
)  # fmt: skip
yaml_text = st.lists(yaml_token, max_size=40).map("".join)


@st.composite
def bomb(draw: st.DrawFn) -> str:
    levels = draw(st.integers(1, 40))
    width = draw(st.integers(1, 12))
    style = draw(st.sampled_from(["list", "merge", "mixed"]))
    lines = ["a0: &a0 {k: [lol]}" if style != "list" else "a0: &a0 [lol]"]
    for i in range(1, levels + 1):
        refs = ", ".join([f"*a{i - 1}"] * width)
        if style == "list" or (style == "mixed" and i % 2):
            lines.append(f"a{i}: &a{i} [{refs}]")
        else:
            lines.append(f"a{i}: &a{i} {{<<: [{refs}], k{i}: x}}" if style == "merge" else
                         f"a{i}: &a{i} {{k{i}: [{refs}]}}")  # fmt: skip
    where = draw(st.sampled_from(["defaults: {retention: *a%d}", "agents: {r: {context: *a%d}}"]))
    lines.append(where % levels)
    return "\n".join(lines) + "\n"


@st.composite
def nested(draw: st.DrawFn) -> tuple[str, str]:
    depth = draw(st.integers(1, 3000))
    ext = draw(st.sampled_from(EXTS))
    opener, closer = draw(st.sampled_from([("[", "]"), ("{a: ", "}")]))
    if ext == ".json" and opener != "[":
        opener = '{"a": '
    if ext == ".toml" and opener != "[":
        opener = "{a = "
    inner = opener * depth + "1" + closer * depth
    head = "a = " if ext == ".toml" else ('{"defaults": ' if ext == ".json" else "defaults: ")
    return head + inner + ("}" if ext == ".json" else "\n"), ext


# ---------------------------------------------------------------------------- properties
@FUZZ
@given(config, st.sampled_from(EXTS))
def test_config_shaped_data_with_hostile_values(data, ext):
    try:
        written = write(data, ext)
    except (yaml.YAMLError, ValueError):  # e.g. a value PyYAML cannot dump
        return
    check_text(written, ext)


@FUZZ
@given(yaml_text, st.sampled_from(EXTS))
def test_yaml_syntax_soup(text_, ext):
    check_text(text_, ext)


@FUZZ
@given(st.binary(max_size=200), st.sampled_from(EXTS))
def test_raw_bytes(raw, ext):
    check_text(raw, ext)


@settings(FUZZ, max_examples=40)
@given(bomb())
def test_alias_bombs_of_every_shape(text_):
    check_text(text_, ".yaml")


@settings(FUZZ, max_examples=30)
@given(nested())
def test_deep_nesting_in_every_format(case):
    text_, ext = case
    check_text(text_, ext)
