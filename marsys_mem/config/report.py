"""Every error of a config or workflow file, located and reported at once.

A file is read with :func:`read_data` (the bounded reader of :mod:`marsys_mem.config.files`,
with the line of every item), validated, and what is wrong is raised as one
:class:`~marsys_mem.exceptions.ConfigError` (a
:class:`~marsys_mem.exceptions.WorkflowError` for workflow files): every error on its own
line, each naming the file, the line and the field, in file order, at most
:data:`MAX_ERRORS` of them and then how many more (:func:`raise_errors`). Retention-policy
files (:func:`marsys_mem.config.load_config`) and workflow files
(:func:`marsys_mem.workflow.load_workflow`, ``marsys-mem validate``) report the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from marsys_mem.config.files import DEFAULT_LIMITS, FileLimits, read_text
from marsys_mem.config.sourcemap import LocatedError, SourceMap, load_with_lines
from marsys_mem.exceptions import ConfigError

__all__ = [
    "MAX_ERRORS",
    "MoreErrors",
    "Problem",
    "is_file",
    "more_errors",
    "raise_errors",
    "read_data",
    "shown_path",
]

MAX_ERRORS = 50
"""The most errors one report lists (then: how many more)."""


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


def _read_text(path: Path, what: str, error: type[ConfigError], limits: FileLimits) -> str:
    try:
        path.stat()
    except FileNotFoundError:
        pass  # read_text says so
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise error(f"{shown_path(path)}: cannot read the {what}: {reason}") from None
    try:
        return read_text(path, what=what, limits=limits)
    except ConfigError as exc:
        raise error(str(exc)) from None


def read_data(
    path: Path,
    what: str,
    *,
    error: type[ConfigError] = ConfigError,
    limits: FileLimits = DEFAULT_LIMITS,
) -> tuple[Any, SourceMap]:
    """The data of a YAML, JSON or TOML file and the line of each item.

    ``what`` names the file in errors (``"workflow file"``); ``error`` is the class raised.

    Raises:
        ConfigError: (``error``) the file is missing, unreadable, too large or does not parse.
    """
    text = _read_text(path, what, error, limits)
    try:
        return load_with_lines(text, name=str(path), limits=limits)
    except ConfigError as exc:
        raise error(str(exc)) from None


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


def raise_errors(
    errors: Sequence[Problem],
    first_file: str | None = None,
    *,
    error: type[ConfigError] = ConfigError,
) -> None:
    """Raise one ``error`` with every error on its own line, in file order.

    Errors of ``first_file`` come first, then those of other files, then lines of other
    reports. At most :data:`MAX_ERRORS` are listed, then how many more there are. Returns
    when there is no error.

    Raises:
        ConfigError: (``error``) there is an error.
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
    raise error("\n".join(lines))


def more_errors(exc: ValidationError) -> list[MoreErrors]:
    """A note for the errors of ``exc`` past the ones located (``MAX_ERRORS + 1``)."""
    hidden = exc.error_count() - (MAX_ERRORS + 1)
    return [MoreErrors(hidden)] if hidden > 0 else []
