"""Reading config and workflow files (YAML, JSON, TOML) safely.

Every file the library reads as configuration goes through :func:`load_file` (or
:func:`parse_text` for text already in memory): retention-policy files
(:func:`~marsys_mem.config.models.load_config`) and workflow files
(:func:`~marsys_mem.config.sourcemap.load_with_lines`, ``marsys-mem validate`` and ``run``).
Whatever the file holds, the answer is the parsed data or a
:class:`~marsys_mem.exceptions.ConfigError` naming the file (and the line where one is
known), quickly and in bounded memory:

* the file is at most :attr:`FileLimits.max_bytes` long and is UTF-8 (a bad byte is
  reported with its offset and line);
* YAML is first scanned event by event, before any node or value exists: a document
  that would expand to more than :attr:`FileLimits.max_values` values once aliases are
  expanded (a "billion laughs" bomb) or nest deeper than :attr:`FileLimits.max_depth` is
  refused at the line where it happens, and so is an alias inside its own anchor (the
  data would be infinite);
* duplicate mapping keys are refused (YAML would silently keep the last; JSON too);
* integers must fit in 64 bits (a 5,000-digit number is refused before it is converted);
* JSON and TOML data gets the same depth / size / integer checks after parsing, and
  their own recursion limits become a ``ConfigError``;
* an empty file is refused: an empty config is a mistake, not a request for defaults.

YAML is parsed by libyaml when PyYAML has it (several times faster) and by PyYAML's
pure-Python parser otherwise. libyaml's composer recurses in C without a limit (a file of
100,000 nested brackets crashes the process), so it only ever sees text the scan passed.

Error messages show values through :func:`short_repr`, never whole.
"""

from __future__ import annotations

import json
import re
import reprlib
import stat
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.error import Mark, MarkedYAMLError
from yaml.nodes import Node, ScalarNode
from yaml.resolver import Resolver

from marsys_mem.exceptions import ConfigError

__all__ = [
    "DEFAULT_LIMITS",
    "FileLimits",
    "ParsedFile",
    "load_file",
    "parse_text",
    "read_text",
    "short_repr",
]

_EVENT_PARSER: Any  # libyaml's event parser: the same events as PyYAML's, several times faster
try:
    from yaml.cyaml import CParser  # type: ignore[attr-defined]

    _EVENT_PARSER = CParser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _EVENT_PARSER = yaml.SafeLoader

_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
_MAX_INT_CHARS = 30  # longer integer literals are refused before int() sees them
_MERGE_TAG = "tag:yaml.org,2002:merge"
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class FileLimits:
    """Bounds on what a config or workflow file may hold.

    Attributes:
        max_bytes: the largest file (or text, UTF-8 encoded) read.
        max_values: the most values (scalars, lists, mappings; keys count) in the parsed
            data, with YAML aliases expanded: this is what stops alias bombs.
        max_depth: the deepest nesting of lists and mappings (aliases expanded).

    Example:
        >>> FileLimits().max_depth, FileLimits(max_bytes=4096).max_bytes
        (64, 4096)
    """

    max_bytes: int = 1 << 20
    max_values: int = 50_000
    max_depth: int = 64


DEFAULT_LIMITS = FileLimits()
"""1 MiB, 50,000 values, 64 levels: far beyond any real config or workflow file."""


@dataclass(frozen=True)
class ParsedFile:
    r"""A parsed file: the data, and the YAML node tree it was built from (for lines).

    ``node`` is the composed YAML tree for YAML files and for JSON files (JSON is read
    again as YAML to learn where each value was written; ``None`` where that fails), and
    ``None`` for TOML files, which have no line information.

    Example:
        >>> parsed = parse_text("a: [1, 2]\n", name="x.yaml")
        >>> parsed.data, parsed.node.start_mark.line
        ({'a': [1, 2]}, 0)
    """

    data: Any
    node: Node | None


# ---------------------------------------------------------------------------- reprs
_REPR = reprlib.Repr()
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlong = 30
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = 5
_REPR.maxdict = 4
_REPR.maxlevel = 3


def short_repr(value: object, limit: int = 100) -> str:
    """``repr(value)`` cut to about ``limit`` characters (long strings, lists, numbers).

    Example:
        >>> short_repr("x" * 1000)[:10], len(short_repr("x" * 1000)) < 80
        ("'xxxxxxxxx", True)
        >>> short_repr(10**40), short_repr(10**5000)
        ('100000000000...000000 (41 digits)', '<integer of 5001 digits>')
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 96:
        digits = value.bit_length() * 30103 // 100000 + 1  # about; str() of it may be refused
        sign = "-" if value < 0 else ""
        return f"{sign}<integer of {digits} digits>" if digits > 4000 else _long_int(value)
    try:
        text = _REPR.repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def _long_int(value: int) -> str:
    text = str(value)
    return f"{text[:12]}...{text[-6:]} ({len(text.lstrip('-'))} digits)"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short_key(part: object) -> str:
    return _cut(part if isinstance(part, str) else short_repr(part), 60)


def _path(parts: Iterable[object]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += f".{_short_key(part)}" if out else _short_key(part)
    return out


# ---------------------------------------------------------------------------- reading
def read_text(path: str | Path, *, what: str = "file", limits: FileLimits = DEFAULT_LIMITS) -> str:
    r"""The text of a UTF-8 file of at most ``limits.max_bytes`` bytes.

    A leading byte-order mark is dropped.

    Raises:
        ConfigError: the file is missing, not a regular file, unreadable, too large, or
            not UTF-8 (the message gives the offset, line and column of the bad byte).

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "c.yaml"
        >>> _ = path.write_bytes(b"a: 1\nb: caf\xe9\n")
        >>> try:
        ...     read_text(path)
        ... except ConfigError as exc:
        ...     print(str(exc).split(": ", 1)[1].split(";")[0])
        not UTF-8: byte 0xe9 at offset 11 (line 2, column 7) cannot be decoded
    """
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(f"{path}: cannot read the {what}: {_os_reason(exc)}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path}: {what} is not a regular file")
    if info.st_size > limits.max_bytes:
        raise ConfigError(_too_big(path, info.st_size, limits))
    try:
        with path.open("rb") as handle:
            raw = handle.read(limits.max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {_os_reason(exc)}") from None
    if len(raw) > limits.max_bytes:  # grew since stat
        raise ConfigError(_too_big(path, len(raw), limits))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(
            f"{path}: not UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start} "
            f"(line {line}, column {column}) cannot be decoded; save the file as UTF-8"
        ) from None
    return text.removeprefix("\ufeff")


def _os_reason(exc: Exception) -> str:
    return str(getattr(exc, "strerror", None) or exc)


def _too_big(name: object, size: int, limits: FileLimits) -> str:
    return (
        f"{name}: the file is too large ({size:,} bytes; at most {limits.max_bytes:,}): "
        "config and workflow files are small"
    )


def load_file(
    path: str | Path, *, what: str = "file", limits: FileLimits = DEFAULT_LIMITS
) -> ParsedFile:
    """Read and parse a YAML / JSON / TOML file (by its extension), within ``limits``.

    Raises:
        ConfigError: the file cannot be read or parsed, breaks a limit, has a duplicate
            key, or is empty; the message names the file (and the line where known).

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "c.json"
        >>> _ = path.write_text('{"version": 1}')
        >>> load_file(path).data
        {'version': 1}
    """
    path = Path(path)
    return parse_text(read_text(path, what=what, limits=limits), name=str(path), limits=limits)


def parse_text(
    text: str, *, name: str, suffix: str | None = None, limits: FileLimits = DEFAULT_LIMITS
) -> ParsedFile:
    """Parse ``text`` as YAML, JSON or TOML (by ``suffix``, else ``name``'s extension).

    Raises:
        ConfigError: as :func:`load_file`; ``name`` is used in the messages.
    """
    ext = (suffix or Path(name).suffix).lower()
    if ext not in (".yaml", ".yml", ".json", ".toml"):
        raise ConfigError(f"{name}: unknown file type {ext!r}; use .yaml, .yml, .json or .toml")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"{name}: not valid Unicode text: {exc.reason} at character {exc.start}"
        ) from None
    if size > limits.max_bytes:
        raise ConfigError(_too_big(name, size, limits))
    node: Node | None = None
    if ext == ".toml":
        data = _parse_toml(text, name)
        if data == {}:
            raise ConfigError(f"{name}: the file is empty (it sets nothing)")
    elif ext == ".json":
        data = _parse_json(text, name)
    else:
        data, node = _parse_yaml(text, name, limits)
    if data is None:
        raise ConfigError(
            f"{name}: the file is empty"
            + ("" if not text.strip() else " (it holds only comments or null)")
        )
    _check_data(data, name, limits)
    if ext == ".json":
        node = _json_nodes(text, limits)
    return ParsedFile(data, node)


# ---------------------------------------------------------------------------- YAML
class _Refused(MarkedYAMLError):
    """A rule of ours (a limit, a duplicate key), not a YAML syntax error."""


def _refuse(problem: str, mark: Mark | None) -> _Refused:
    return _Refused(None, None, problem, mark)


class _StrictConstructor(SafeConstructor):
    """PyYAML's safe constructor, with bounded integers and no raw exceptions."""

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, ArithmeticError, TypeError, LookupError) as exc:  # 2024-13-01
            shown = short_repr(node.value) if isinstance(node, ScalarNode) else node.tag
            raise _refuse(f"cannot read {shown}: {_cut(str(exc), 160)}", node.start_mark) from None

    def construct_yaml_int(self, node: ScalarNode) -> int:
        text = str(node.value).replace("_", "").lstrip("+-")
        if len(text) > _MAX_INT_CHARS:
            raise _refuse(
                f"integer {short_repr(node.value)} is {len(text)} characters long; "
                "integers must fit in 64 bits",
                node.start_mark,
            )
        value: int = super().construct_yaml_int(node)
        if not _INT_MIN <= value <= _INT_MAX:
            raise _refuse(f"integer {value} does not fit in 64 bits", node.start_mark)
        return value

    yaml_constructors = {  # noqa: RUF012 - PyYAML's registry, as add_constructor builds it
        **SafeConstructor.yaml_constructors,
        "tag:yaml.org,2002:int": construct_yaml_int,
    }


# libyaml's composer recurses in C without a limit (a deeply nested file crashes the
# process), so it only ever sees text that _scan has passed: nesting of at most
# max_depth, a bounded expansion and no recursive alias.
_LoaderBase: Any = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


class _Loader(_StrictConstructor, _LoaderBase):  # type: ignore[misc]
    """The fastest safe loader PyYAML has here, with the strict constructor."""

    def __init__(self, text: str) -> None:
        _LoaderBase.__init__(self, text)


class _Frame:
    """An open sequence or mapping while scanning events."""

    __slots__ = ("anchor", "depth", "keys", "mapping", "size", "want_key")

    def __init__(self, mapping: bool, anchor: str | None) -> None:
        self.mapping = mapping
        self.anchor = anchor
        self.size = 1
        self.depth = 1
        self.keys: dict[Any, Mark] = {}
        self.want_key = True


_NO_KEY = object()  # a key that is not compared: an alias, a collection, a merge key


class _Scanner:
    """One pass over the YAML events, before any node or value is built.

    Refuses what would be too large once aliases are expanded (a "billion laughs"
    bomb), too deep, recursive (an alias inside its own anchor) or a duplicate key. Each
    anchor's expanded size and depth are remembered, so an alias costs O(1).
    """

    def __init__(self, limits: FileLimits) -> None:
        self.limits = limits
        self.stack: list[_Frame] = []
        self.anchors: dict[str, tuple[int, int]] = {}
        self.keys = _StrictConstructor()
        self.resolver = Resolver()
        self.aliased = False

    def run(self, text: str) -> None:
        parser: Any = _EVENT_PARSER(text)
        try:
            while True:
                event = parser.get_event()
                kind = type(event)
                if kind is yaml.ScalarEvent:
                    self.add(1, 1, event, self.key_of(event))
                    if event.anchor is not None:
                        self.anchors[event.anchor] = (1, 1)
                elif kind is yaml.AliasEvent:
                    self.alias(event)
                elif kind is yaml.SequenceStartEvent or kind is yaml.MappingStartEvent:
                    self.open(event, kind is yaml.MappingStartEvent)
                elif kind is yaml.SequenceEndEvent or kind is yaml.MappingEndEvent:
                    self.close(event)
                elif kind is yaml.DocumentEndEvent:
                    self.anchors.clear()
                elif kind is yaml.StreamEndEvent:
                    return
        finally:
            parser.dispose()

    def key_of(self, event: Any) -> Any:
        frame = self.stack[-1] if self.stack else None
        if frame is None or not frame.mapping or not frame.want_key:
            return _NO_KEY
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolver.resolve(  # type: ignore[no-untyped-call]
                ScalarNode, event.value, event.implicit
            )
        if tag == "tag:yaml.org,2002:str":
            return event.value
        if tag == _MERGE_TAG:
            return _NO_KEY
        node = ScalarNode(tag, event.value, event.start_mark, event.end_mark)
        try:  # 1 and 0x1 are the same key once read
            key = self.keys.construct_object(node)
            hash(key)
        except (TypeError, yaml.YAMLError):  # reported when the data is built
            return _NO_KEY
        return key

    def alias(self, event: Any) -> None:
        anchor = event.anchor
        if any(frame.anchor == anchor for frame in self.stack):
            raise _refuse(
                f"recursive alias *{_short_key(anchor)}: it refers to the value that "
                "contains it, which would be infinite",
                event.start_mark,
            )
        size, depth = self.anchors.get(anchor, (1, 1))  # undefined: the composer says so
        self.aliased = True
        self.add(size, depth, event, _NO_KEY)

    def open(self, event: Any, mapping: bool) -> None:
        if self.stack and self.stack[-1].mapping and self.stack[-1].want_key:
            self.stack[-1].want_key = False  # a collection as a key: not compared
        elif self.stack and self.stack[-1].mapping:
            self.stack[-1].want_key = True
        if len(self.stack) >= self.limits.max_depth:
            raise _refuse(f"nested deeper than {self.limits.max_depth} levels", event.start_mark)
        self.stack.append(_Frame(mapping, event.anchor))

    def close(self, event: Any) -> None:
        frame = self.stack.pop()
        if frame.depth > self.limits.max_depth:
            raise _refuse(
                f"nested deeper than {self.limits.max_depth} levels once aliases are expanded",
                event.start_mark,
            )
        if frame.anchor is not None:
            self.anchors[frame.anchor] = (frame.size, frame.depth)
        if self.stack:
            parent = self.stack[-1]
            self.grow(parent, frame.size, frame.depth, event)

    def add(self, size: int, depth: int, event: Any, key: Any) -> None:
        if not self.stack:
            return
        frame = self.stack[-1]
        if frame.mapping:
            if frame.want_key and key is not _NO_KEY:
                first = frame.keys.setdefault(key, event.start_mark)
                if first is not event.start_mark:
                    raise _refuse(
                        f"duplicate key {short_repr(key)} (first on line {first.line + 1}): "
                        "a key may appear once in a mapping",
                        event.start_mark,
                    )
            frame.want_key = not frame.want_key
        self.grow(frame, size, depth, event)

    def grow(self, frame: _Frame, size: int, depth: int, event: Any) -> None:
        frame.size += size
        frame.depth = max(frame.depth, depth + 1)
        if frame.size > self.limits.max_values:
            why = (
                "once aliases are expanded (an alias bomb?)"
                if self.aliased
                else "(config and workflow files are small)"
            )
            raise _refuse(f"more than {self.limits.max_values:,} values {why}", event.start_mark)


def _compose(text: str, limits: FileLimits) -> tuple[_Loader, Node | None]:
    _Scanner(limits).run(text)
    loader = _Loader(text)
    try:
        return loader, loader.get_single_node()
    finally:
        loader.dispose()


def _parse_yaml(text: str, name: str, limits: FileLimits) -> tuple[Any, Node | None]:
    try:
        loader, node = _compose(text, limits)
        data = loader.construct_document(node) if node is not None else None
    except _Refused as exc:
        raise ConfigError(f"{name}{_refused(exc)}") from None
    except yaml.YAMLError as exc:
        if "nesting depth" in str(getattr(exc, "problem", None) or ""):
            # libyaml (PyYAML >= 6.0.4) stops at 1,000 levels while it scans ahead, before
            # any event reaches the depth check: deeper than max_depth all the same
            mark = getattr(exc, "problem_mark", None)
            where = f":{mark.line + 1}" if mark is not None else ""
            raise ConfigError(
                f"{name}{where}: nested deeper than {limits.max_depth} levels"
            ) from None
        raise ConfigError(f"{name}{_yaml_problem(exc, len(text))}") from None
    except RecursionError:  # pragma: no cover - the depth limit comes first
        raise ConfigError(f"{name}: nested too deeply") from None
    return data, node


def _json_nodes(text: str, limits: FileLimits) -> Node | None:
    """JSON read again as YAML, for line numbers (``None`` where YAML cannot read it)."""
    try:
        return _compose(text, limits)[1]
    except (yaml.YAMLError, RecursionError):
        return None


def _refused(exc: _Refused) -> str:
    mark = exc.problem_mark
    where = f":{mark.line + 1}" if mark is not None else ""
    return f"{where}: {exc.problem}"


def _yaml_problem(exc: yaml.YAMLError, size: int) -> str:
    """``:LINE: invalid YAML: ...`` with the most useful line (not the end of the file)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    p_mark = getattr(exc, "problem_mark", None)
    c_mark = getattr(exc, "context_mark", None)
    mark = p_mark
    if c_mark is not None and (p_mark is None or p_mark.index >= size):
        mark = c_mark  # "found unexpected end of stream": where the construct began
    where = f":{mark.line + 1}" if mark is not None else ""
    detail = problem
    if p_mark is not None:
        detail += f" (line {p_mark.line + 1}, column {p_mark.column + 1})"
    if context:
        opened = f" (line {c_mark.line + 1}, column {c_mark.column + 1})" if c_mark else ""
        detail = f"{context}{opened}: {detail}"
    return f"{where}: invalid YAML: {detail}"


# ---------------------------------------------------------------------------- JSON, TOML
class _JsonRefused(Exception):
    """Raised from inside ``json.loads`` hooks."""


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JsonRefused(f"duplicate key {short_repr(key)}: a key may appear once")
        out[key] = value
    return out


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_CHARS:
        raise _JsonRefused(
            f"integer {short_repr(text)} has {len(text.lstrip('-'))} digits; "
            "integers must fit in 64 bits"
        )
    return int(text)


def _json_constant(text: str) -> Any:
    raise _JsonRefused(f"{text} is not JSON (write a number or a string)")


def _parse_json(text: str, name: str) -> Any:
    try:
        return json.loads(
            text,
            object_pairs_hook=_json_pairs,
            parse_int=_json_int,
            parse_constant=_json_constant,
        )
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{name}:{exc.lineno}: invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except _JsonRefused as exc:
        raise ConfigError(f"{name}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{name}: nested deeper than Python can parse") from None


def _parse_toml(text: str, name: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{name}: invalid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{name}: nested deeper than Python can parse") from None
    except ValueError as exc:  # int() of a number of more than 4,300 digits
        problem = str(exc)
        if "integer string conversion" in problem:
            problem = "an integer of thousands of digits; integers must fit in 64 bits"
        raise ConfigError(f"{name}: invalid TOML: {_cut(problem, 160)}") from None


# ---------------------------------------------------------------------------- checks
def _check_data(data: Any, name: str, limits: FileLimits) -> None:
    """Depth, size, integer range and text of parsed data (iterative: no recursion)."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(data, 1, ())]
    count = 0

    def where(path: tuple[Any, ...]) -> str:
        return f"{name}: {_path(path)}" if path else name

    while stack:
        value, depth, path = stack.pop()
        count += 1
        if count > limits.max_values:
            raise ConfigError(f"{name}: more than {limits.max_values:,} values")
        if depth > limits.max_depth:
            raise ConfigError(f"{where(path)}: nested deeper than {limits.max_depth} levels")
        if isinstance(value, str):
            if not value.isascii() and _SURROGATE.search(value):
                raise ConfigError(
                    f"{where(path)}: {short_repr(value)} holds a lone surrogate, which is not "
                    "text (a JSON \\uD800-\\uDFFF escape without its pair?)"
                )
        elif isinstance(value, int) and not isinstance(value, bool):
            if not _INT_MIN <= value <= _INT_MAX:
                raise ConfigError(
                    f"{where(path)}: integer {short_repr(value)} does not fit in 64 bits"
                )
        elif isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, depth + 1, path))
                stack.append((item, depth + 1, (*path, key)))
        elif isinstance(value, list | tuple | set | frozenset):
            for i, item in enumerate(value):
                stack.append((item, depth + 1, (*path, i)))
