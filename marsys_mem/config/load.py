"""Loading a retention-policy file: read once, validate, every error located.

:func:`load_config` is the public way in (``MemoryManager.from_config`` uses it);
:func:`load_config_file` also returns the file's data and lines, for tools that check a
workflow referring to the file. Both read through :func:`marsys_mem.config.report.read_data`
(the one bounded reader) and report through :func:`marsys_mem.config.report.raise_errors`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from marsys_mem.config.files import DEFAULT_LIMITS, FileLimits
from marsys_mem.config.models import MemoryConfig
from marsys_mem.config.report import (
    MAX_ERRORS,
    Problem,
    is_file,
    more_errors,
    raise_errors,
    read_data,
    shown_path,
)
from marsys_mem.config.sourcemap import SourceMap, located_errors
from marsys_mem.exceptions import ConfigError

__all__ = ["ConfigFile", "config_schema", "load_config", "load_config_file"]


@functools.cache
def config_schema() -> dict[str, Any]:
    """The retention-policy format's JSON Schema (``marsys-mem schema``)."""
    return MemoryConfig.model_json_schema()


@dataclass(frozen=True)
class ConfigFile:
    r"""A retention-policy file, validated: the config, and the data and lines it came from.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "policy.yaml"
        >>> _ = path.write_text("defaults: {retention: persistent}\n")
        >>> loaded = load_config_file(path)
        >>> loaded.config.defaults.retention, loaded.lines.line(("defaults",))
        ('persistent', 1)
    """

    config: MemoryConfig
    data: Any
    lines: SourceMap | None


def load_config_file(
    path: str | Path,
    *,
    where: str = "",
    error: type[ConfigError] = ConfigError,
    limits: FileLimits = DEFAULT_LIMITS,
) -> ConfigFile:
    """Read and validate a retention-policy file; every error with file, line and field.

    Args:
        path: the file (YAML, TOML or JSON, by extension).
        where: prefixes the "not found" error (``"workflow.yaml: "``).
        error: the class raised (a workflow check raises :class:`WorkflowError`).
        limits: bounds on size, nesting and YAML alias expansion.

    Raises:
        ConfigError: (``error``) the file is missing, does not parse, or is invalid.
    """
    path = Path(path)
    if not is_file(path) and not _exists(path):  # else the reader says what it is
        raise error(f"{where}config file not found: {shown_path(path)}")
    data, lines = read_data(path, "config file", error=error, limits=limits)
    file = str(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise error(f"{file}: the top level must be a mapping, got {type(data).__name__}")
    try:
        config = MemoryConfig.model_validate(data, context={"source": path.resolve()})
    except ValidationError as exc:
        errors: list[Problem] = []
        errors += located_errors(
            exc, data, lines, file=file, schema=config_schema(), limit=MAX_ERRORS + 1
        )
        errors += more_errors(exc)
        raise_errors(errors, file, error=error)
        raise  # pragma: no cover - raise_errors raised
    return ConfigFile(config, data, lines)


def _exists(path: Path) -> bool:
    """Whether something is at ``path`` (a folder, a device); a bad name counts as there."""
    try:
        path.stat()
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    return True


def load_config(path: str | Path, *, limits: FileLimits = DEFAULT_LIMITS) -> MemoryConfig:
    """Load and validate a config file (YAML, TOML or JSON, by extension).

    The file is read by the one bounded reader (:mod:`marsys_mem.config.files`): its size,
    nesting and YAML alias expansion are bounded by ``limits``; duplicate keys, integers
    beyond 64 bits and bytes that are not UTF-8 are refused.

    Raises:
        ConfigError: the file is missing, unparsable, too large or invalid; every error on
            its own line, naming the file, the line, the field path and the bad value.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "team.json"
        >>> _ = path.write_text('{"agents": {"researcher": {"retention": "persistent"}}}')
        >>> load_config(path).agents["researcher"].retention
        'persistent'
    """
    return load_config_file(path, limits=limits).config
