"""Fuzz: workflow and retention-policy files through ``check_file`` and ``marsys-mem validate``.

Hypothesis writes workflow-ish documents (plausible keys and names, typos, wrong types,
odd values, nested run / repeat blocks) and mutates the bundled examples (as data: a value
replaced, a key dropped or misspelled; as text: characters deleted or inserted, lines
duplicated, swapped or re-indented). Whatever the file holds, validating it either
succeeds or raises a library error (:class:`~marsys_mem.exceptions.MarsysMemError`), never
a raw exception, within 1 s, with messages that never repeat a huge value; the command
line exits 0 or 2, never 1.

Validation plays a workflow's repeats (it must: a fork inside a repeat can collide with
itself in the second iteration), so its time grows with the number of steps a workflow
expands to, at a few microseconds per step, up to the cap of 200,000 steps (beyond it a
file is refused at once, see ``test_validate.py``). Repeat counts are therefore drawn
from 1-2,000 and from values past the cap, not from the band in between where a valid
workflow legitimately takes longer than 1 s to plan on a loaded machine.
"""

import contextlib
import json
import shutil
import string
import tempfile
import time
import tomllib
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marsys_mem.cli.main import main
from marsys_mem.config.load import config_schema
from marsys_mem.exceptions import MarsysMemError
from marsys_mem.workflow import STEP_KINDS, check_file
from marsys_mem.workflow.models import workflow_schema

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / "examples" / "workflows").glob("*"))
POLICIES = sorted((ROOT / "examples" / "policies").glob("*"))
EXAMPLES = WORKFLOWS + POLICIES
TEXTS = {p: p.read_text(encoding="utf-8") for p in EXAMPLES}
# CPU seconds (process_time): the heaviest case takes ~0.6 s quiet, 2.2 s seen under load;
# the bombs this guards against took 68 s
LIMIT_S = 5.0
MAX_LINE = 2_000  # no error line repeats a whole value


def _field_names(schema: dict) -> list[str]:
    names: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            names.update(k for k in node.get("properties", {}) if isinstance(k, str))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return sorted(names)


FIELDS = sorted({*_field_names(workflow_schema()), *_field_names(config_schema()), *STEP_KINDS})
NAMES = ["planner", "researcher", "assistant", "a", "b", "main", "r1", "r2", "mian", "plannr"]
WORDS = [
    *NAMES,
    *STEP_KINDS,
    "persistent",
    "session",
    "single_run",
    "summarize",
    "sliding_window",
    "trim_oldest",
    "memory",
    "sqlite",
    "30d",
    "1e300",
    "{i}",
    "{item}",
    "{n}",
    "team.yaml",
    "support-bot.toml",
    "ephemeral.json",
    "x" * 300,
    "a/b",
    "a#b",
]
TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)


def _typo(word: str, i: int) -> str:
    if not word:
        return "x"
    i %= len(word)
    return [word[:i] + word[i + 1 :], word[:i] + word[i] + word[i:], word[::-1]][i % 3]


keys = st.one_of(
    st.sampled_from(FIELDS),
    st.builds(_typo, st.sampled_from(FIELDS), st.integers(0, 20)),
    TEXT,
    st.integers(-3, 3),
)
ints = st.one_of(
    st.integers(-5, 2_000), st.integers(min_value=10**6), st.integers(max_value=-(10**6))
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(WORDS),
    TEXT,
)
values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=4),
    max_leaves=16,
)


@st.composite
def step_bodies(draw, depth: int):
    body = draw(
        st.dictionaries(st.sampled_from(FIELDS), scalars | st.sampled_from(NAMES), max_size=5)
    )
    if draw(st.booleans()):
        body["agent"] = draw(st.sampled_from(NAMES))
    if depth < 2 and draw(st.integers(0, 3)) == 0:
        body["steps"] = draw(st.lists(steps(depth + 1), max_size=3))
        body["times"] = draw(st.integers(-1, 30) | ints)
    return body


def steps(depth: int = 0):
    kinds = st.sampled_from(STEP_KINDS) | st.builds(
        _typo, st.sampled_from(STEP_KINDS), st.integers()
    )
    short = st.builds(lambda k, b: {k: b}, kinds, step_bodies(depth))
    long = st.builds(lambda k, b: {**b, "kind": k}, kinds, step_bodies(depth))
    return st.one_of(short, short, long, kinds, values)


AGENTS = ["planner", "researcher", "a"]
BRANCHES = ["main", "r1", "r2", "r{i}"]


@st.composite
def plausible_step(draw, depth: int = 0):
    """A step of the right shape, mostly with names that exist; sometimes one thing off."""

    def name(options):
        return draw(
            st.sampled_from(options) if draw(st.integers(0, 19)) else st.sampled_from(NAMES)
        )

    kind = draw(st.sampled_from(STEP_KINDS if depth < 2 else STEP_KINDS[:6]))
    text = draw(st.sampled_from(["hi", "{i} of {n}: {item}", "fact {i}", "{item}", ""]))
    agent = name(AGENTS)
    if kind in ("say", "ask", "end_run"):
        body: dict = {"agent": agent}
        body.update(
            {"say": {"text": text}, "ask": {"question": "what?", "expect": text}}.get(kind, {})
        )
    elif kind == "tool":
        body = {"agent": agent, "name": "search", "arguments": {"q": text}, "result": text}
    elif kind == "call_agent":
        body = {"caller": agent, "callee": name(AGENTS), "request": text, "response": text}
    elif kind == "share":
        scope = draw(st.sampled_from(["branch", "subtree", "lineage", "global", "galaxy"]))
        body = {"agent": agent, "fact": text, "scope": scope}
    elif kind == "fork":
        body = {"parent": name(BRANCHES), "child": name(BRANCHES)}
    elif kind == "merge":
        strategy = draw(st.sampled_from(["facts", "summary", "messages"]))
        body = {"child": name(BRANCHES), "into": name(BRANCHES), "strategy": strategy}
    elif kind == "run":
        body = {"agent": agent, "steps": draw(st.lists(plausible_step(depth + 1), max_size=3))}
    elif kind == "end_session":
        body = {"restart": draw(st.booleans())}
    else:
        body = {
            "times": draw(st.integers(1, 30)),
            "items": draw(
                st.lists(st.sampled_from(["x", "y", "r1", "", "a/b"]), min_size=1, max_size=3)
            ),
            "steps": draw(st.lists(plausible_step(depth + 1), min_size=1, max_size=3)),
        }
    if kind in ("say", "share", "ask", "tool") and draw(st.integers(0, 3)) == 0:
        body["branch"] = name(BRANCHES)
    if draw(st.integers(0, 24)) == 0:  # one field misspelled or of the wrong type
        key = draw(st.sampled_from(sorted(body)))
        if draw(st.booleans()):
            body[_typo(key, draw(st.integers(0, 9)))] = body.pop(key)
        else:
            body[key] = draw(scalars)
    return {kind: body} if draw(st.integers(0, 4)) else {"kind": kind, **body}


@st.composite
def workflow_docs(draw):
    if draw(st.integers(0, 2)):
        doc = {"agents": list(AGENTS), "steps": draw(st.lists(plausible_step(), max_size=6))}
        if draw(st.booleans()):
            doc["branches"] = [
                {"name": "main", "agents": ["planner", "researcher"]},
                {"name": "side", "parent": "main", "agents": ["a"]},
            ]
        if draw(st.booleans()):
            name = draw(
                st.sampled_from(AGENTS) if draw(st.integers(0, 4)) else st.sampled_from(NAMES)
            )
            doc["memory"] = {
                "store": {"backend": draw(st.sampled_from(["memory", "sqlite"]))},
                "defaults": {"retention": draw(st.sampled_from(["persistent", "session"]))},
                "agents": {name: {"context": {"max_tokens": 500}}},
            }
        return doc
    return draw(random_docs())


@st.composite
def random_docs(draw):
    doc: dict = {}
    if draw(st.booleans()):
        doc["version"] = draw(st.sampled_from([1, 1, 2, "1"]) | scalars)
    agent = st.sampled_from(NAMES) | st.fixed_dictionaries(
        {"name": st.sampled_from(NAMES) | TEXT}, optional={"system": TEXT, "sytem": TEXT}
    )
    if draw(st.integers(0, 9)):
        doc["agents"] = draw(st.lists(agent | scalars, max_size=4))
    if draw(st.booleans()):
        branch = st.fixed_dictionaries(
            {"name": st.sampled_from(NAMES)},
            optional={
                "agents": st.lists(st.sampled_from(NAMES), max_size=3),
                "parent": st.sampled_from(NAMES),
            },
        )
        doc["branches"] = draw(st.lists(branch | values, max_size=3))
    doc["steps"] = draw(st.lists(steps(), max_size=8))
    memory_choice = draw(st.integers(0, 4))
    if memory_choice == 1:
        doc["memory"] = {"config": draw(st.sampled_from(WORDS))}
    elif memory_choice == 2:
        doc["memory"] = draw(st.dictionaries(keys, values, max_size=4))
    elif memory_choice == 3:
        doc["memory"] = {
            "store": {"backend": draw(st.sampled_from(["memory", "sqlite", "redis"]))},
            "defaults": {"retention": draw(st.sampled_from(["persistent", "session", "x"]))},
            "agents": {draw(st.sampled_from(NAMES)): {"retention": "persistent"}},
        }
    if draw(st.integers(0, 5)) == 0:
        doc["transport"] = draw(values)
    if draw(st.integers(0, 5)) == 0:
        doc[draw(keys)] = draw(values)
    return doc


# ---------------------------------------------------------------------------- mutations
def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _paths(value, (*prefix, i))


def _mutate_data(draw, data):
    paths = [p for p in _paths(data) if p]
    for _ in range(draw(st.integers(1, 3))):
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        how = draw(st.sampled_from(["replace", "delete", "rename", "extra"]))
        with contextlib.suppress(KeyError, IndexError, TypeError):
            if how == "replace":
                parent[last] = draw(values)
            elif how == "delete":
                del parent[last]
            elif how == "rename" and isinstance(parent, dict) and isinstance(last, str):
                parent[_typo(last, draw(st.integers(0, 20)))] = parent.pop(last)
            elif isinstance(parent, dict):
                parent[draw(keys)] = draw(values)
        paths = [p for p in _paths(data) if p]
    return data


SPECIALS = ":{}[]-&*!|>'\"#%@`,? \n\t"


def _mutate_text(draw, text):
    for _ in range(draw(st.integers(1, 4))):
        lines = text.splitlines(keepends=True) or [""]
        how = draw(st.sampled_from(["delete", "insert", "dup", "swap", "indent"]))
        if how in ("delete", "insert") and text:
            at = draw(st.integers(0, len(text) - 1))
            if how == "delete":
                text = text[:at] + text[at + draw(st.integers(1, 20)) :]
            else:
                alphabet = st.sampled_from(SPECIALS + string.ascii_letters) | TEXT
                text = text[:at] + "".join(draw(st.lists(alphabet, max_size=4))) + text[at:]
            continue
        i = draw(st.integers(0, len(lines) - 1))
        j = draw(st.integers(0, len(lines) - 1))
        if how == "dup":
            lines.insert(j, lines[i])
        elif how == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines[i] = " " * draw(st.integers(0, 6)) + lines[i].lstrip(" ")
        text = "".join(lines)
    return text


@st.composite
def mutated_examples(draw):
    path = draw(st.sampled_from(EXAMPLES))
    text = TEXTS[path]
    if path.suffix != ".toml" and draw(st.booleans()):
        data = yaml.safe_load(text) if path.suffix == ".yaml" else json.loads(text)
        data = _mutate_data(draw, data)
        if path.suffix == ".json":
            text = json.dumps(data)
        else:
            text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
    else:
        text = _mutate_text(draw, text)
    return path.suffix, text


# ---------------------------------------------------------------------------- the check
@pytest.fixture(scope="module")
def folder():
    with tempfile.TemporaryDirectory(prefix="fuzz-workflow-") as tmp:
        for policy in POLICIES:  # `memory: {config: team.yaml}` finds a real file
            shutil.copy(policy, tmp)
        yield Path(tmp)


def check(path: Path, via_cli: bool, capsys) -> None:
    started = time.process_time()
    try:
        check_file(path)
    except MarsysMemError as exc:
        message = str(exc)
        assert message, "an error without a message"
        assert all(len(line) <= MAX_LINE for line in message.splitlines()), message[:500]
    elapsed = time.process_time() - started
    assert elapsed < LIMIT_S, f"{elapsed:.2f} s for {path.read_text(errors='replace')[:300]!r}"
    if via_cli:
        capsys.readouterr()
        started = time.process_time()
        code = main(["validate", str(path)])
        elapsed = time.process_time() - started
        _, err = capsys.readouterr()
        assert code in (0, 2), err
        assert "unexpected" not in err, err
        assert elapsed < LIMIT_S


def write(folder: Path, suffix: str, text: str) -> Path:
    path = folder / f"candidate{suffix}"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _repeat(times, steps, items=None):
    body = {"times": times, "steps": steps}
    if items is not None:
        body["items"] = items
    return {"repeat": body}


# Hostile inputs that once escaped as raw exceptions, took seconds, or printed huge messages.
HOSTILE = [
    # substituting {item} = "" into a required text: a raw pydantic ValidationError
    {"agents": ["a"], "steps": [_repeat(2, [{"share": {"agent": "a", "fact": "{item}"}}], [""])]},
    # a config path the OS cannot look up (name too long): a raw OSError
    {"agents": ["a"], "memory": {"config": "x" * 300}},
    {"agents": ["a"], "memory": {"config": "a\x00b.yaml"}},
    # 10^10 steps after expanding: planned up to the cap first (4 s)
    {
        "agents": ["a"],
        "steps": [_repeat(100_000, [_repeat(100_000, [{"say": {"agent": "a", "text": "x"}}])])],
    },
    # names that are megabytes long: the message repeated them whole
    {"agents": ["a"], "steps": [{"say": {"agent": "y" * 200_000, "text": "x"}}]},
    {"agents": ["a"], "memory": {"agents": {"z" * 100_000: {}}}},
    {"agents": ["a"], "steps": [{"z" * 100_000: {}}]},
    # thousands of errors
    {
        "agents": ["a"],
        "steps": [{"say": {"agent": "a", "text": "x", "colour": i}} for i in range(5000)],
    },
    {"agents": ["a"], "steps": [{"say": {"agent": f"b{i}", "text": "x"}} for i in range(5000)]},
    # a repeat whose every iteration fails
    {"agents": ["a"], "steps": [_repeat(100_000, [{"say": {"agent": "b", "text": "x"}}])]},
    {"agents": ["a"], "steps": [_repeat(50_000, [{"fork": {"parent": "main", "child": "r1"}}])]},
]


@FUZZ
@given(doc=workflow_docs(), fmt=st.sampled_from([".yaml", ".json"]), via_cli=st.booleans())
def test_workflow_like_documents(folder, capsys, doc, fmt, via_cli):
    """Workflow-ish documents: mostly plausible steps with a name or field off, or noise."""
    if fmt == ".json":
        text = json.dumps(doc, default=str)
    else:
        text = yaml.safe_dump(doc, allow_unicode=True)
    check(write(folder, fmt, text), via_cli, capsys)


@pytest.mark.parametrize("doc", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_documents(folder, capsys, doc):
    check(write(folder, ".json", json.dumps(doc)), True, capsys)


@FUZZ
@given(case=mutated_examples(), via_cli=st.booleans())
def test_mutated_examples(folder, capsys, case, via_cli):
    suffix, text = case
    check(write(folder, suffix, text), via_cli, capsys)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.binary(max_size=300), suffix=st.sampled_from([".yaml", ".json", ".toml"]))
def test_arbitrary_bytes(folder, capsys, raw, suffix):
    path = folder / f"bytes{suffix}"
    path.write_bytes(raw)
    check(path, False, capsys)


def test_the_examples_themselves_validate(folder, capsys):
    """The mutations start from valid files (so a failure above is the mutation's doing)."""
    for path in EXAMPLES:
        assert check_file(path).warnings == []
        data = tomllib.loads(TEXTS[path]) if path.suffix == ".toml" else yaml.safe_load(TEXTS[path])
        assert isinstance(data, dict)
