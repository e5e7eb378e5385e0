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

Files are read by :mod:`marsys_mem.config_files` (bounded size, nesting and YAML alias
expansion; duplicate keys refused). JSON files are parsed with :mod:`json` (exact JSON
errors, with line and column) and mapped with the YAML composer (JSON is YAML), so their
errors carry lines too. TOML files have no line information (:mod:`tomllib` does not
record it): their errors name the field only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from marsys_mem.config_files import DEFAULT_LIMITS, FileLimits, parse_text

__all__ = ["Located", "SourceMap", "format_path", "load_with_lines", "locate", "locate_errors"]

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

    The text is read by :func:`marsys_mem.config_files.parse_text`: sizes, nesting and
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
            out += f".{part}" if out else str(part)
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
    line = source_map.line(data_path) if source_map is not None else None
    return Located(file, line, format_path(shown))


def _is_field_name(part: str) -> bool:
    """Pydantic adds tags like ``str``, ``dict[str,any]``, ``function-after[...]``."""
    return part.isidentifier() and part not in ("str", "int", "float", "bool", "list", "dict")


def locate_errors(
    exc: ValidationError,
    data: Any,
    source_map: SourceMap | None = None,
    *,
    file: str | None = None,
    prefix: Sequence[PathPart] = (),
    tags: Collection[str] = (),
) -> list[str]:
    """One line per distinct location: ``file:LINE: field.path: message (got value)``.

    Union members that fail at the same place are merged into one line.
    """
    grouped: dict[str, list[str]] = {}
    order: list[str] = []
    for err in exc.errors(include_url=False):
        loc = (*prefix, *err["loc"])
        where = str(locate(data, loc, source_map, file=file, tags=tags))
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        got = err.get("input")
        if err["type"] not in ("missing",) and not isinstance(got, dict | list):
            msg += f" (got {got!r})"
        if where not in grouped:
            grouped[where] = []
            order.append(where)
        if msg not in grouped[where]:
            grouped[where].append(msg)
    return [
        f"{where}: {' or '.join(grouped[where])}" if where else " or ".join(grouped[where])
        for where in order
    ]
