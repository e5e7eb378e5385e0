"""Reading YAML / JSON / TOML files while remembering where each value was written.

Config and workflow files are validated by pydantic, whose errors name a field path such
as ``("steps", 3, "say", "agent")``. :func:`load_with_lines` returns the parsed data
together with a :class:`SourceMap` (the line of every mapping key and sequence item, from
``yaml.compose`` node marks), and :func:`locate` turns an error path into what a person
needs: ``workflow.yaml:14: steps[3].agent``.

Paths are resolved against the data, so pydantic's union tags (``say`` for a step of kind
``say``, ``str`` for a ``str | dict`` member) never show up, and a step written in the
short form ``- say: {agent: ..., text: ...}`` is addressed like the long form
``- {kind: say, agent: ..., text: ...}``.

:func:`located_errors` gives every error of a validation, each at its own line. Given the
model's JSON Schema it names an unknown field with the closest allowed one
(``stratgy: unknown field (did you mean 'strategy'?)``, :func:`schema_fields`) and leaves
out the "Field required" of the field that was misspelled.

Files are read by :mod:`marsys_mem.config.files` (bounded size, nesting and YAML alias
expansion; duplicate keys refused). JSON files are parsed with :mod:`json` (exact JSON
errors, with line and column) and mapped with the YAML composer (JSON is YAML), so their
errors carry lines too. TOML files have no line information (:mod:`tomllib` does not
record it): their errors name the field only.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from marsys_mem.config.files import DEFAULT_LIMITS, FileLimits, parse_text, short_repr

__all__ = [
    "Located",
    "LocatedError",
    "SourceMap",
    "did_you_mean",
    "format_path",
    "load_with_lines",
    "locate",
    "locate_errors",
    "located_errors",
    "schema_fields",
]

PathPart = str | int


@dataclass
class SourceMap:
    r"""The 1-based line of every mapping key and sequence item of a parsed file.

    Example:
        >>> data, lines = load_with_lines("steps:\n  - kind: say\n    agent: bob\n",
        ...                               name="wf.yaml")
        >>> lines.line(("steps", 0, "agent")), lines.line(("steps", 0))
        (3, 2)
    """

    lines: dict[tuple[PathPart, ...], int] = field(default_factory=dict)

    def line(self, path: Sequence[PathPart]) -> int | None:
        """The line of ``path``, or of its longest prefix that has one (``None``: none)."""
        parts = tuple(path)
        while parts:
            found = self.lines.get(parts)
            if found is not None:
                return found
            parts = parts[:-1]
        return self.lines.get(())


def _walk_nodes(node: yaml.Node, path: tuple[PathPart, ...], out: dict[Any, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is None:
                continue
            child = (*path, key)
            out.setdefault(child, key_node.start_mark.line + 1)
            _walk_nodes(value_node, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            child = (*path, i)
            out[child] = item.start_mark.line + 1
            _walk_nodes(item, child, out)


def _map_node(node: yaml.Node | None) -> SourceMap:
    """Lines from a composed tree (its size and depth are bounded by the reader's limits)."""
    out: dict[tuple[PathPart, ...], int] = {}
    if node is not None:
        out[()] = node.start_mark.line + 1
        _walk_nodes(node, (), out)
    return SourceMap(out)


def load_with_lines(
    text: str, *, name: str, suffix: str | None = None, limits: FileLimits = DEFAULT_LIMITS
) -> tuple[Any, SourceMap]:
    """Parse ``text`` (YAML, JSON or TOML by ``suffix`` or ``name``'s extension).

    The text is read by :func:`marsys_mem.config.files.parse_text`: sizes, nesting and
    YAML alias expansion are bounded by ``limits``, duplicate keys and empty files are
    refused.

    Raises:
        ConfigError: the text does not parse or breaks a limit; the message names
            ``name`` and, where known, the line and the column.
    """
    parsed = parse_text(text, name=name, suffix=suffix, limits=limits)
    return parsed.data, _map_node(parsed.node)


def format_path(parts: Iterable[PathPart]) -> str:
    """``("steps", 3, "agent")`` -> ``steps[3].agent``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = str(part)
            if len(text) > 60:  # a key can be anything: never repeat a huge one
                text = short_repr(text, 60)
            out += f".{text}" if out else text
    return out


@dataclass(frozen=True)
class Located:
    """Where an error is: the file, the line (if known) and the field path as written.

    Example:
        >>> str(Located("wf.yaml", 14, "steps[3].agent"))
        'wf.yaml:14: steps[3].agent'
    """

    file: str | None
    line: int | None
    path: str

    def __str__(self) -> str:
        where = self.file or ""
        if self.file and self.line is not None:
            where += f":{self.line}"
        if where and self.path:
            return f"{where}: {self.path}"
        return where or self.path


@dataclass(frozen=True)
class LocatedError:
    """One error of a file: where it is and what is wrong.

    Example:
        >>> str(LocatedError(Located("wf.yaml", 3, "steps[0].txt"), "unknown field"))
        'wf.yaml:3: steps[0].txt: unknown field'
    """

    where: Located
    message: str

    def __str__(self) -> str:
        where = str(self.where)
        return f"{where}: {self.message}" if where else self.message


def _resolve(
    data: Any, loc: Sequence[PathPart], tags: Collection[str]
) -> tuple[list[PathPart], list[PathPart]]:
    """``loc`` as a path into ``data`` (for lines) and as shown to a person."""
    node = data
    data_path: list[PathPart] = []
    shown: list[PathPart] = []
    for part in loc:
        if isinstance(node, dict):
            if part not in node and len(node) == 1:
                (only,) = node
                if only in tags and isinstance(node[only], dict):
                    data_path.append(only)
                    node = node[only]
            if part in node:
                data_path.append(part)
                if not (part in tags and len(node) == 1 and isinstance(node[part], dict)):
                    shown.append(part)
                node = node[part]
                continue
            if isinstance(part, str) and part not in tags and _is_field_name(part):
                shown.append(part)  # a missing field: named, located at its parent
                node = None
            continue
        if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            data_path.append(part)
            shown.append(part)
            node = node[part]
            continue
        if node is None and isinstance(part, str) and _is_field_name(part):
            shown.append(part)
    return data_path, shown


def locate(
    data: Any,
    loc: Sequence[PathPart],
    source_map: SourceMap | None = None,
    *,
    file: str | None = None,
    tags: Collection[str] = (),
) -> Located:
    """Resolve an error path against ``data``.

    ``tags`` are the discriminator tags of the model's unions: a path part that is a tag
    and not in the data is skipped, and a mapping whose single key is a tag (a step
    written as ``- say: {...}``) is looked through (its key is in the data path, not in
    the displayed one). Other parts missing from the data are named fields that are
    missing, shown and located at their parent.
    """
    data_path, shown = _resolve(data, loc, tags)
    line = source_map.line(data_path) if source_map is not None else None
    return Located(file, line, format_path(shown))


def _is_field_name(part: str) -> bool:
    """Pydantic adds tags like ``str``, ``dict[str,any]``, ``function-after[...]``."""
    return part.isidentifier() and part not in ("str", "int", "float", "bool", "list", "dict")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known``, or ``""``.

    Example:
        >>> did_you_mean("stratgy", ["strategy", "max_tokens"])
        " (did you mean 'strategy'?)"
    """
    close = _closest(name, known)
    return f" (did you mean {close!r}?)" if close is not None else ""


def _closest(name: str, known: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


# ---------------------------------------------------------------------------- schema walk
_Schema = dict[str, Any]


def _alternatives(schema: Any, root: _Schema, seen: frozenset[str] = frozenset()) -> list[_Schema]:
    """The concrete schemas ``schema`` stands for ($ref followed, oneOf/anyOf/allOf opened)."""
    if not isinstance(schema, dict):
        return []
    ref = schema.get("$ref")
    if isinstance(ref, str):
        if ref in seen or not ref.startswith("#/$defs/"):
            return []
        target = root.get("$defs", {}).get(ref[len("#/$defs/") :])
        return _alternatives(target, root, seen | {ref})
    out: list[_Schema] = []
    for key in ("oneOf", "anyOf"):
        for sub in schema.get(key, ()):
            out.extend(_alternatives(sub, root, seen))
    if "allOf" in schema:
        merged: _Schema = {"properties": {}, "required": []}
        for sub in schema["allOf"]:
            for alt in _alternatives(sub, root, seen):
                merged["properties"].update(alt.get("properties", {}))
                merged["required"] += list(alt.get("required", ()))
                if "additionalProperties" in alt:
                    merged["additionalProperties"] = alt["additionalProperties"]
        out.append(merged)
    if {"properties", "additionalProperties", "items"} & set(schema):
        out.append(schema)
    return out


def _matching(alts: list[_Schema], node: Any) -> list[_Schema]:
    """Drop alternatives whose ``const`` properties disagree with ``node``; prefer agreeing ones."""
    if not isinstance(node, dict):
        return alts
    kept, agreeing = [], []
    for alt in alts:
        consts = {
            k: p["const"]
            for k, p in alt.get("properties", {}).items()
            if isinstance(p, dict) and "const" in p and k in node
        }
        if any(node[k] != v for k, v in consts.items()):
            continue
        kept.append(alt)
        if consts:
            agreeing.append(alt)
    return agreeing or kept


def schema_fields(schema: _Schema, data: Any, data_path: Sequence[PathPart]) -> list[str]:
    """The field names the JSON Schema allows for the mapping at ``data_path`` of ``data``.

    Example:
        >>> schema = {"properties": {"ctx": {"properties": {"max_tokens": {}}}}}
        >>> schema_fields(schema, {"ctx": {"max_tokns": 5}}, ["ctx"])
        ['max_tokens']
    """
    alts = _alternatives(schema, schema)
    node = data
    for part in data_path:
        alts = _matching(alts, node)
        nxt: list[_Schema] = []
        for alt in alts:
            if isinstance(part, int):
                nxt.extend(_alternatives(alt.get("items"), schema))
            elif part in alt.get("properties", {}):
                nxt.extend(_alternatives(alt["properties"][part], schema))
            elif isinstance(alt.get("additionalProperties"), dict):
                nxt.extend(_alternatives(alt["additionalProperties"], schema))
        alts = nxt
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
    names: list[str] = []
    for alt in _matching(alts, node):
        names.extend(n for n in alt.get("properties", {}) if n not in names)
    return names


# ---------------------------------------------------------------------------- errors
def located_errors(
    exc: ValidationError,
    data: Any,
    source_map: SourceMap | None = None,
    *,
    file: str | None = None,
    prefix: Sequence[PathPart] = (),
    tags: Collection[str] = (),
    schema: _Schema | None = None,
    limit: int | None = None,
) -> list[LocatedError]:
    """Every error of ``exc``, each located at its own line (see :func:`locate_errors`).

    ``limit``: look at the first ``limit`` errors only (``exc.error_count()`` says how
    many there are): a file with thousands of errors is reported quickly.
    """
    items: list[tuple[list[PathPart], list[PathPart], str, str]] = []
    explained: set[tuple[tuple[PathPart, ...], str]] = set()
    for err in exc.errors(include_url=False)[:limit]:
        loc = (*prefix, *err["loc"])
        data_path, shown = _resolve(data, loc, tags)
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        got = err.get("input")
        if err["type"] == "extra_forbidden" and data_path and schema is not None:
            msg, close = _unknown_field(schema, data, data_path, tags)
            if close is not None:
                explained.add((tuple(data_path[:-1]), close))
        elif err["type"] != "missing" and not isinstance(got, dict | list):
            shown_value = short_repr(got)
            if shown_value not in msg:
                msg += f" (got {shown_value})"
        items.append((data_path, shown, err["type"], msg))
    grouped: dict[Located, list[str]] = {}
    for data_path, shown, kind, msg in items:
        if kind == "missing" and shown and (tuple(data_path), str(shown[-1])) in explained:
            continue  # "text: Field required" beside "txt: unknown field (did you mean 'text'?)"
        line = source_map.line(data_path) if source_map is not None else None
        where = Located(file, line, format_path(shown))
        messages = grouped.setdefault(where, [])
        if msg not in messages:
            messages.append(msg)
    return [LocatedError(where, " or ".join(msgs)) for where, msgs in grouped.items()]


def _unknown_field(
    schema: _Schema, data: Any, data_path: Sequence[PathPart], tags: Collection[str]
) -> tuple[str, str | None]:
    """``unknown field (did you mean 'x'?)`` and ``x``, or the allowed fields and ``None``.

    Fields already in the mapping are not suggested; under a union tag (``- say: {...}``)
    the tag's own field ``kind`` is implied and not listed.
    """
    name = data_path[-1]
    parent: Any = data
    for part in data_path[:-1]:
        parent = parent[part]
    allowed = schema_fields(schema, data, data_path[:-1])
    if len(data_path) >= 2 and data_path[-2] in tags:
        allowed = [f for f in allowed if f != "kind"]
    present = parent if isinstance(parent, dict) else {}
    close = _closest(str(name)[:100], [f for f in allowed if f not in present])
    if close is not None:
        return f"unknown field (did you mean {close!r}?)", close
    if allowed:
        return f"unknown field; expected one of: {', '.join(allowed)}", None
    return "unknown field", None


def locate_errors(
    exc: ValidationError,
    data: Any,
    source_map: SourceMap | None = None,
    *,
    file: str | None = None,
    prefix: Sequence[PathPart] = (),
    tags: Collection[str] = (),
    schema: _Schema | None = None,
) -> list[str]:
    """One line per distinct location: ``file:LINE: field.path: message (got value)``.

    Union members that fail at the same place are merged into one line. With the
    model's JSON ``schema``, an unknown field is named with the closest allowed one
    (``unknown field (did you mean 'strategy'?)``), and the "Field required" error of
    that allowed field is left out.
    """
    return [
        str(e)
        for e in located_errors(
            exc, data, source_map, file=file, prefix=prefix, tags=tags, schema=schema
        )
    ]
