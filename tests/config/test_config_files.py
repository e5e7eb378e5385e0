"""The one reader of config and workflow files: hostile files get a ConfigError, fast.

Regression tests for issue 9, items 10 (YAML bombs) and 11 (raw exceptions, duplicate
keys, empty files), through the library (load_config, load_with_lines, load_workflow)
and through the CLI (`marsys-mem validate` / `run` exit 2 with one line).
"""

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from marsys_mem.cli.main import main
from marsys_mem.config.files import FileLimits, load_file, parse_text, short_repr
from marsys_mem.config.load import load_config
from marsys_mem.config.sourcemap import load_with_lines
from marsys_mem.exceptions import ConfigError, WorkflowError
from marsys_mem.workflow import load_workflow, validate_config_file


def laughs(levels: int, width: int = 9) -> str:
    """A billion-laughs config: ``width ** levels`` copies of one string once expanded."""
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    lines.append(f"defaults: {{retention: *a{levels}}}")
    return "\n".join(lines) + "\n"


def merge_bomb(levels: int, width: int = 9) -> str:
    """The same with merge keys: every level merges ``width`` copies of the one below."""
    lines = ["m0: &m0 {k0: lol, k1: lol}"]
    for i in range(1, levels + 1):
        refs = ", ".join([f"*m{i - 1}"] * width)
        lines.append(f"m{i}: &m{i} {{<<: [{refs}], k{i + 1}: x}}")
    lines.append(f"defaults: {{context: *m{levels}}}")
    return "\n".join(lines) + "\n"


def wide_bomb(copies: int) -> str:
    """One anchored list of 100 items referred to ``copies`` times in one flow list."""
    items = ", ".join(["x"] * 100)
    return f"a: &a [{items}]\nb: [" + ", ".join(["*a"] * copies) + "]\n"


def _timed_error(call, *args) -> tuple[str, float]:
    started = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        call(*args)
    return str(info.value), time.perf_counter() - started


# ---------------------------------------------------------------------------- item 10: bombs
@pytest.mark.parametrize(
    "text",
    [laughs(6), laughs(9), laughs(30, width=2), merge_bomb(8), wide_bomb(5_000)],
    ids=["laughs-9^6", "laughs-9^9", "laughs-2^30", "merge-9^8", "wide-500k"],
)
def test_alias_bombs_are_refused_in_under_a_second(tmp_path, text):
    # before: 9^6 gave an 8.7 MB message, 9^9 ran 68 s and 4 GB into MemoryError
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    for call in (load_config, validate_config_file, load_workflow):
        msg, elapsed = _timed_error(call, path)
        assert elapsed < 1.0, (call.__name__, elapsed)
        assert len(msg) < 300, len(msg)
        assert msg.startswith(f"{path}:")
        assert "aliases are expanded" in msg
    msg, elapsed = _timed_error(lambda: load_with_lines(text, name="bomb.yaml"))
    assert elapsed < 1.0
    assert msg.startswith("bomb.yaml:")


def test_a_bomb_is_refused_before_any_data_is_built():
    # 30 levels of 2: 2^30 values; refused at the first node over the limit
    limits = FileLimits(max_values=1_000)
    with pytest.raises(ConfigError, match=r"bomb.yaml:\d+: more than 1,000 values") as info:
        parse_text(laughs(30, width=2), name="bomb.yaml", limits=limits)
    line = int(str(info.value).split(":")[1])
    assert line <= 11  # 2^10 values: refused where it happens, not at the end of the file


def test_anchors_and_merge_keys_within_the_limits_still_work(tmp_path):
    path = tmp_path / "team.yaml"
    path.write_text(
        "x-base: &base {retention: persistent, ttl: 30d}\n"
        "x-ctx: &ctx {max_tokens: 4000}\n"
        "agents:\n"
        "  a: {<<: *base, context: *ctx}\n"
        "  b: {<<: *base, ttl: 7d, context: *ctx}\n"
    )
    parsed = load_file(path)
    assert parsed.data["agents"]["b"] == {
        "retention": "persistent",
        "ttl": "7d",
        "context": {"max_tokens": 4000},
    }


# ---------------------------------------------------------------------------- item 11
def test_a_recursive_alias_is_refused_with_its_line():
    # before: the CLI crashed with RecursionError (exit 1); load_config gave a confusing error
    text = "version: 1\ndefaults: &d {context: *d}\n"
    with pytest.raises(ConfigError, match=r"^c.yaml:2: recursive alias \*d"):
        load_with_lines(text, name="c.yaml")
    with pytest.raises(ConfigError, match="recursive alias"):
        parse_text("- &a [*a]\n", name="c.yaml")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("flow.yaml", "defaults: " + "[" * 3000 + "]" * 3000 + "\n"),
        ("deep.yaml", "defaults: " + "[" * 200_000 + "]" * 200_000 + "\n"),
        ("block.yaml", "".join(f"{' ' * i}k{i}:\n" for i in range(200)) + " " * 200 + "v\n"),
        ("deep.json", '{"defaults": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        ("mid.json", '{"defaults": ' + "[" * 500 + "]" * 500 + "}"),
        ("deep.toml", "a = " + "[" * 3000 + "]" * 3000 + "\n"),
        ("keys.toml", "a" + ".a" * 300 + " = 1\n"),
    ],
    ids=lambda v: v if v.count(".") == 1 else "",
)
def test_deep_nesting_is_a_config_error(tmp_path, name, text):
    # before: RecursionError (YAML, JSON, TOML); libyaml's own composer even segfaults
    path = tmp_path / name
    path.write_text(text)
    msg, elapsed = _timed_error(load_config, path)
    assert "nested deeper than" in msg
    assert elapsed < 1.0


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("big.yaml", "agents: {r: {max_stored_messages: " + "9" * 5000 + "}}\n"),
        ("big.json", '{"agents": {"r": {"max_stored_messages": ' + "9" * 5000 + "}}}"),
        ("big.toml", "[agents.r]\nmax_stored_messages = " + "9" * 5000 + "\n"),
        ("hex.yaml", "agents: {r: {max_stored_messages: 0x" + "f" * 5000 + "}}\n"),
        ("sexagesimal.yaml", "agents:\n  r:\n    max_stored_messages: 1" + ":59" * 3000 + "\n"),
        ("over64.yaml", f"agents: {{r: {{max_stored_messages: {2**64}}}}}\n"),
        ("over64.toml", f"[agents.r]\nmax_stored_messages = {2**63}\n"),
    ],
    ids=lambda v: v if len(v) < 20 else "",
)
def test_huge_integers_are_refused(tmp_path, name, text):
    # before: ValueError "Exceeds the limit (4300 digits)" escaped raw
    path = tmp_path / name
    path.write_text(text)
    msg, elapsed = _timed_error(load_config, path)
    assert "64 bits" in msg
    assert len(msg) < 300
    assert elapsed < 1.0


def test_integers_up_to_64_bits_are_read():
    data = parse_text(f"a: {2**63 - 1}\nb: {-(2**63)}\n", name="c.yaml").data
    assert data == {"a": 2**63 - 1, "b": -(2**63)}


def test_non_utf8_file_names_the_byte_offset_and_line(tmp_path):
    # before: UnicodeDecodeError escaped from load_config
    path = tmp_path / "latin1.yaml"
    path.write_bytes("version: 1\nagents: {r: {retention: 'caf\xe9'}}\n".encode("latin-1"))
    msg, _ = _timed_error(load_config, path)
    assert msg == (
        f"{path}: not UTF-8: byte 0xe9 at offset 39 (line 2, column 29) cannot be decoded; "
        "save the file as UTF-8"
    )


def test_a_byte_order_mark_is_accepted(tmp_path):
    for ext in ("yaml", "json", "toml"):
        path = tmp_path / f"c.{ext}"
        text = "version = 1\n" if ext == "toml" else '{"version": 1}'
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert load_config(path).version == 1


@pytest.mark.parametrize(
    ("text", "line", "first"),
    [
        ("defaults: {retention: persistent}\ndefaults: {retention: session}\n", 2, 1),
        ("agents:\n  r:\n    ttl: 1d\n    retention: session\n    ttl: 2d\n", 5, 3),
        ("agents: {r: {}, q: {}, r: {}}\n", 1, 1),
        ("version: 1\n1: a\n0x1: b\n", 3, 2),  # equal keys written differently
    ],
)
def test_duplicate_yaml_keys_are_refused_with_both_lines(tmp_path, text, line, first):
    # before: accepted silently, the last one winning
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    msg, _ = _timed_error(load_config, path)
    assert msg.startswith(f"{path}:{line}: duplicate key ")
    assert f"(first on line {first})" in msg


def test_merged_keys_may_be_overridden(tmp_path):
    text = "x: &x {retention: session, ttl: 1d}\nagents: {r: {<<: *x, ttl: 2d}}\n"
    assert parse_text(text, name="c.yaml").data["agents"]["r"]["ttl"] == "2d"


def test_duplicate_json_keys_are_refused():
    with pytest.raises(ConfigError, match=r"^c.json: duplicate key 'version'"):
        parse_text('{"version": 1, "version": 2}', name="c.json")


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("date.yaml", "version: 1\nagents: {r: {ttl: 2024-13-01}}\n", ":2: cannot read '2024-13"),
        ("nan.json", '{"version": NaN}', "NaN is not JSON"),
        ("surrogate.json", '{"agents": {"r\\udc80": {}}}', "lone surrogate"),
        ("tag.yaml", "version: !!python/object:os.system x\n", "invalid YAML"),
        ("two.yaml", "version: 1\n---\nversion: 1\n", "expected a single document"),
        ("list.yaml", "- 1\n- 2\n", "must be a mapping"),
    ],
)
def test_other_bad_content_is_a_config_error(tmp_path, name, text, says):
    # before: the impossible date raised a raw ValueError
    path = tmp_path / name
    path.write_text(text)
    msg, _ = _timed_error(load_config, path)
    assert msg.startswith(str(path))
    assert says in msg


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("version: 1\n" + "# padding\n" * 120_000)
    msg, elapsed = _timed_error(load_config, path)
    assert "too large (1,200,011 bytes; at most 1,048,576)" in msg
    assert elapsed < 1.0
    assert load_config(path, limits=FileLimits(max_bytes=2 << 20)).version == 1


@pytest.mark.parametrize("where", ["dir", "nul", "missing"])
def test_paths_that_are_not_files(tmp_path, where):
    path = {"dir": tmp_path, "nul": tmp_path / "a\x00.yaml", "missing": tmp_path / "n.yaml"}
    msg, _ = _timed_error(load_config, path[where])
    assert {"dir": "not a regular file", "nul": "cannot read", "missing": "not found"}[where] in msg


def test_short_repr_bounds_every_kind_of_value():
    assert len(short_repr("x" * 10**6)) < 80
    assert len(short_repr([["y" * 1000] * 1000] * 1000)) <= 100
    assert short_repr(10**5000) == "<integer of 5001 digits>"
    assert short_repr({"a": 1}) == "{'a': 1}"


# ---------------------------------------------------------------------------- the CLI
BAD_FILES = {
    "bomb.yaml": laughs(9),
    "recursive.yaml": "defaults: &d {context: *d}\n",
    "inf.yaml": "agents: {r: {ttl: .inf}}\n",
    "e300.json": '{"agents": {"r": {"ttl": 1e300}}}',
    "days.yaml": "agents: {r: {ttl: 9999999999d}}\n",
    "deep.yaml": "defaults: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep.json": '{"defaults": ' + "[" * 5000 + "]" * 5000 + "}",
    "digits.yaml": "agents: {r: {max_stored_messages: " + "9" * 5000 + "}}\n",
    "digits.toml": "[agents.r]\nmax_stored_messages = " + "9" * 5000 + "\n",
    "dup.yaml": "defaults: {retention: persistent}\ndefaults: {retention: session}\n",
    "empty.yaml": "",
    "empty.toml": "",
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
@pytest.mark.parametrize("command", ["validate", "run"])
def test_cli_exits_2_with_one_clear_line(tmp_path, capsys, command, name):
    # before: inf/1e300/days exited 1 (OverflowError), recursive/deep exited 1
    # (RecursionError), dup/empty exited 0, the bomb ran past 90 s
    path = tmp_path / name
    path.write_text(BAD_FILES[name])
    started = time.perf_counter()
    code = main([command, str(path)])
    elapsed = time.perf_counter() - started
    _, err = capsys.readouterr()
    assert code == 2, err
    assert err.startswith(f"error: {path}"), err
    assert err.count("\n") == 1, err
    assert len(err) < 300
    assert "unexpected" not in err
    assert elapsed < 1.0


def test_json_line_numbers_survive_the_new_reader(tmp_path):
    path = tmp_path / "wf.json"
    path.write_text(json.dumps({"agents": ["a"], "steps": [{"say": {"agent": "b"}}]}, indent=1))
    with pytest.raises(WorkflowError, match=r"wf.json:\d+: steps\[0\]"):
        load_workflow(path)


def test_every_example_file_still_reads():
    root = Path(__file__).resolve().parents[2] / "examples"
    files = sorted(root.glob("policies/*")) + sorted(root.glob("workflows/*.yaml"))
    assert len(files) >= 6
    for path in files:
        assert isinstance(load_file(path).data, dict)


FALLBACK = """
import sys, time
sys.modules["yaml.cyaml"] = None  # as if PyYAML had been built without libyaml
import yaml
yaml.__with_libyaml__ = False
from marsys_mem.config import files as cf
from marsys_mem.exceptions import ConfigError
assert cf._EVENT_PARSER is yaml.SafeLoader and cf._LoaderBase is yaml.SafeLoader
CASES = [
    (BOMB, "aliases are expanded"),
    ("a: " + "[" * 100000 + "]" * 100000, "nested deeper"),
    ("a: &a [*a]\\n", "recursive alias"),
    ("a: 1\\na: 2\\n", "duplicate key"),
    ("a: " + "9" * 5000, "64 bits"),
]
for text, says in CASES:
    started = time.process_time()
    try:
        cf.parse_text(text, name="x.yaml")
    except ConfigError as exc:
        assert says in str(exc), str(exc)
    else:
        raise SystemExit("accepted: " + says)
    assert time.process_time() - started < 2.0, says  # CPU seconds, not wall time
print(cf.parse_text("a: {<<: {b: 1}, c: [1, 2]}", name="x.yaml").data)
"""


def test_the_pure_python_parser_has_the_same_limits():
    # PyYAML without libyaml: the same scan, PyYAML's own (recursive, but bounded) composer
    script = FALLBACK.replace("BOMB", repr(laughs(9)))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'a': {'b': 1, 'c': [1, 2]}}"
