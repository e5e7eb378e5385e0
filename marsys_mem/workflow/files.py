"""Reading workflow and retention-policy files: every error located and reported at once.

The workflow tools (``load_workflow``, ``check_file``, ``marsys-mem validate``) read a
file with :func:`read_data` (the bounded reader of :mod:`marsys_mem.config.files`, with
the line of every item), validate it, and report what is wrong as one
:class:`~marsys_mem.workflow.models.WorkflowError`: every error on its own line, each
naming the file, the line and the field, in file order, at most :data:`MAX_ERRORS` of
them and then how many more (:func:`raise_errors`).

:func:`load_config_file` reads a retention-policy file that way (a workflow's
``memory: {config: policy.yaml}``, or a policy file given to ``validate``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from marsys_mem.config.files import read_text
from marsys_mem.config.models import MemoryConfig
from marsys_mem.config.sourcemap import LocatedError, SourceMap, load_with_lines, located_errors
from marsys_mem.exceptions import ConfigError, WorkflowError

__all__ = [
    "MAX_ERRORS",
    "ConfigFile",
    "MoreErrors",
    "Problem",
    "config_schema",
    "is_file",
    "load_config_file",
    "more_errors",
    "raise_errors",
    "read_data",
    "shown_path",
]

MAX_ERRORS = 50
"""The most errors one report lists (then: how many more)."""


@functools.cache
def config_schema() -> dict[str, Any]:
    """The retention-policy format's JSON Schema (``marsys-mem schema``)."""
    return MemoryConfig.model_json_schema()


def shown_path(path: Path) -> str:
    """The path as text, its middle cut out when it is very long.

    Example:
        >>> shown_path(Path("policies/team.yaml"))
        'policies/team.yaml'
    """
    text = str(path)
    return text if len(text) <= 200 else f"{text[:120]}...{text[-60:]}"


def is_file(path: Path) -> bool:
    """``path.is_file()``, false where the name cannot even be looked up (too long, ...)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _read_text(path: Path, what: str) -> str:
    try:
        path.stat()
    except FileNotFoundError:
        pass  # read_text says so
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise WorkflowError(f"{shown_path(path)}: cannot read the {what}: {reason}") from None
    try:
        return read_text(path, what=what)
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None


def read_data(path: Path, what: str) -> tuple[Any, SourceMap]:
    """The data of a YAML, JSON or TOML file and the line of each item.

    ``what`` names the file in errors (``"workflow file"``).

    Raises:
        WorkflowError: the file is missing, unreadable, too large or does not parse.
    """
    text = _read_text(path, what)
    try:
        return load_with_lines(text, name=str(path))
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None


@dataclass(frozen=True)
class MoreErrors:
    """Errors left out of a report: ``count`` of them, or ``None``: checking stopped.

    Example:
        >>> MoreErrors(3).count
        3
    """

    count: int | None


Problem = LocatedError | str | MoreErrors
"""A located error, a line from another report (a referenced config file), or a note."""


def raise_errors(errors: Sequence[Problem], first_file: str | None = None) -> None:
    """Raise one :class:`WorkflowError` with every error on its own line, in file order.

    Errors of ``first_file`` come first, then those of other files, then lines of other
    reports. At most :data:`MAX_ERRORS` are listed, then how many more there are. Returns
    when there is no error.

    Raises:
        WorkflowError: there is an error.
    """
    notes = [e for e in errors if isinstance(e, MoreErrors)]
    real = [e for e in errors if not isinstance(e, MoreErrors)]
    if not real:
        return

    def order(e: LocatedError | str) -> tuple[int, int]:
        if isinstance(e, str):
            return (2, 0)
        return (0 if e.where.file == first_file else 1, e.where.line or 0)

    ordered = sorted(real, key=order)
    lines = [str(e) for e in ordered[:MAX_ERRORS]]
    more = len(ordered) - len(lines) + sum(n.count or 0 for n in notes)
    stopped = any(n.count is None for n in notes)
    if stopped:
        lines.append(f"... and more: checking stopped after {len(ordered) + more} errors")
    elif more:
        lines.append(f"... and {more} more error{'s' if more > 1 else ''}")
    raise WorkflowError("\n".join(lines))


def more_errors(exc: ValidationError) -> list[MoreErrors]:
    """A note for the errors of ``exc`` past the ones located (``MAX_ERRORS + 1``)."""
    hidden = exc.error_count() - (MAX_ERRORS + 1)
    return [MoreErrors(hidden)] if hidden > 0 else []


@dataclass(frozen=True)
class ConfigFile:
    r"""A retention-policy file, validated: the config, and the data and lines it came from.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "policy.yaml"
        >>> _ = path.write_text("defaults: {retention: persistent}\n")
        >>> loaded = load_config_file(path, "")
        >>> loaded.config.defaults.retention, loaded.lines.line(("defaults",))
        ('persistent', 1)
    """

    config: MemoryConfig
    data: Any
    lines: SourceMap | None


def load_config_file(path: Path, where: str) -> ConfigFile:
    """Read and validate a retention-policy file; every error with file, line and field.

    ``where`` prefixes the "not found" error (``"workflow.yaml: "``).

    Raises:
        WorkflowError: the file is missing, does not parse, or is invalid.
    """
    if not is_file(path):
        raise WorkflowError(f"{where}config file not found: {shown_path(path)}")
    data, lines = read_data(path, "config file")
    config = _validate_config_data(data, lines, path)
    return ConfigFile(config, data, lines)


def _validate_config_data(data: Any, lines: SourceMap | None, path: Path) -> MemoryConfig:
    file = str(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise WorkflowError(f"{file}: a config file is a mapping, got {type(data).__name__}")
    try:
        return MemoryConfig.model_validate(data, context={"source": path.resolve()})
    except ValidationError as exc:
        errors: list[Problem] = []
        errors += located_errors(
            exc, data, lines, file=file, schema=config_schema(), limit=MAX_ERRORS + 1
        )
        errors += more_errors(exc)
        raise_errors(errors, file)
        raise  # pragma: no cover - raise_errors raised
