"""Retention policies and the config file format.

A config file (YAML, TOML or JSON) says where memory is stored and, per agent, how long it
lives and how much of it goes into the context window::

    version: 1
    store: {backend: sqlite, path: .marsys_mem/memory.db}
    defaults:
      retention: session                     # single_run | session | persistent
      context: {max_messages: 50, max_tokens: 8000, strategy: sliding_window}
    agents:
      researcher:
        retention: persistent
        ttl: 30d                              # enforced by the store
        max_stored_messages: 10000
        context: {max_tokens: 4000, strategy: summarize, keep_recent: 20}
      scratchpad: {retention: single_run}

Each agent's settings are the defaults overridden field by field (``context`` key by key;
when an agent changes the strategy, summarize-only keys of the defaults are dropped).
A relative ``store.path`` is resolved against the config file's folder.

Retention kinds:

* ``single_run``: memory lives for one ``MemoryManager.run``; cleared when it ends.
* ``session``: memory lives until ``MemoryManager.end_session()``; never written to disk.
* ``persistent``: memory is written to the store and reloaded by the next process;
  ``ttl`` and ``max_stored_messages`` bound it.

Errors are :class:`~marsys_mem.exceptions.ConfigError` naming the file, the field path and
the bad value. ``MemoryConfig.model_json_schema()`` gives the JSON Schema for editors.
"""

from __future__ import annotations

import json
import re
import tomllib
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from marsys_mem.compose import BudgetSplit
from marsys_mem.context import ContextPolicy
from marsys_mem.exceptions import ConfigError

__all__ = [
    "AgentConfig",
    "Duration",
    "EpisodicPatternConfig",
    "HierarchicalPatternConfig",
    "MemoryConfig",
    "PatternsConfig",
    "RagPatternConfig",
    "RetentionKind",
    "RetentionPolicy",
    "StoreConfig",
    "format_validation_error",
    "load_config",
    "parse_duration",
]

RetentionKind = Literal["single_run", "session", "persistent"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


def parse_duration(value: object) -> timedelta:
    """Parse ``30d``, ``12h``, ``1d12h``, ``90m``, ``45s``, ``2w``, seconds, or a timedelta.

    Raises:
        ValueError: anything else, or a duration that is not positive.
    """
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    elif isinstance(value, int | float):
        result = timedelta(seconds=value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        pos, seconds = 0, 0.0
        for match in _DURATION.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if not text or pos != len(text):
            raise ValueError(
                f"invalid duration {value!r}: use a number and a unit s/m/h/d/w, "
                "e.g. 30d, 12h, 1d12h"
            )
        result = timedelta(seconds=seconds)
    else:
        raise ValueError(f"invalid duration {value!r}: expected a string like '30d' or seconds")
    if result <= timedelta(0):
        raise ValueError(f"duration must be positive, got {value!r}")
    return result


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
"""A positive duration, written ``30d``, ``12h``, ``1d12h`` or as seconds."""


def _enabled(value: object) -> object:
    """``true`` enables a pattern with its defaults; ``false`` disables it."""
    if value is True:
        return {}
    if value is False:
        return None
    return value


class RagPatternConfig(BaseModel):
    """Retrieval over the agent's whole history (``patterns.rag``).

    Example:
        >>> RagPatternConfig(k=4, mode="bm25").k
        4
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    k: int = Field(default=4, ge=1, le=100)
    min_score: float | None = None
    mode: Literal["hybrid", "dense", "bm25"] = "hybrid"
    dense_weight: float = Field(default=1.0, ge=0.0)
    bm25_weight: float = Field(default=1.0, ge=0.0)


class EpisodicPatternConfig(BaseModel):
    """Episodes (one per run) recalled by meaning (``patterns.episodic``).

    Example:
        >>> EpisodicPatternConfig().k
        3
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    k: int = Field(default=3, ge=1, le=100)


class HierarchicalPatternConfig(BaseModel):
    """Core / working / archival tiers (``patterns.hierarchical``).

    Example:
        >>> HierarchicalPatternConfig(core_threshold=0.9).working_size
        20
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    core_threshold: float = Field(default=0.8, ge=0.0, le=1.0)
    working_size: int = Field(default=20, ge=1)
    k: int = Field(default=3, ge=1, le=100)


class PatternsConfig(BaseModel):
    """Which memory patterns an agent uses, their parameters, and the budget split.

    ``embedder``: ``default`` (the packaged MiniLM when the ``embeddings`` extra is
    installed, else BM25 only with one notice), ``hashing`` (deterministic, not semantic)
    or ``none`` (BM25 only). ``budget``: the most of ``max_tokens`` each block may take.

    Example:
        >>> cfg = PatternsConfig.model_validate({"rag": True, "budget": {"retrieval": 0.3}})
        >>> cfg.rag.k, cfg.episodic is None, cfg.budget.retrieval
        (4, True, 0.3)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    embedder: Literal["default", "hashing", "none"] = "default"
    rag: Annotated[RagPatternConfig | None, BeforeValidator(_enabled)] = None
    episodic: Annotated[EpisodicPatternConfig | None, BeforeValidator(_enabled)] = None
    hierarchical: Annotated[HierarchicalPatternConfig | None, BeforeValidator(_enabled)] = None
    budget: BudgetSplit = Field(default_factory=BudgetSplit)

    @property
    def any(self) -> bool:
        """True if some retrieval pattern is enabled."""
        return any(p is not None for p in (self.rag, self.episodic, self.hierarchical))


class RetentionPolicy(BaseModel):
    """How long an agent's memory lives, how much is stored, and its context window.

    Example:
        >>> p = RetentionPolicy(retention="persistent", ttl="30d", max_stored_messages=10_000)
        >>> p.ttl.days, p.context.strategy
        (30, 'sliding_window')
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    retention: RetentionKind = "session"
    ttl: Duration | None = None
    max_stored_messages: int | None = Field(default=None, ge=1)
    context: ContextPolicy = Field(default_factory=ContextPolicy)
    patterns: PatternsConfig = Field(default_factory=PatternsConfig)

    @property
    def is_persistent(self) -> bool:
        """True for ``persistent`` retention."""
        return self.retention == "persistent"


class AgentConfig(BaseModel):
    """One agent's overrides of the defaults; every field is optional.

    Example:
        >>> AgentConfig(retention="single_run").retention
        'single_run'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    retention: RetentionKind | None = None
    ttl: Duration | None = None
    max_stored_messages: int | None = Field(default=None, ge=1)
    context: dict[str, Any] | None = None
    patterns: dict[str, Any] | None = None


class StoreConfig(BaseModel):
    """Where persistent memory lives.

    ``backend``: ``memory`` (nothing survives the process) or ``sqlite`` (``path``,
    default ``.marsys_mem/memory.db``). ``namespace`` separates projects sharing a store.

    Example:
        >>> StoreConfig(backend="sqlite", path="mem.db").namespace
        'default'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["memory", "sqlite"] = "memory"
    path: Path | None = None
    namespace: str = Field(default="default", min_length=1)

    @model_validator(mode="after")
    def _check(self) -> StoreConfig:
        if self.backend == "memory" and self.path is not None:
            raise ValueError("path is only used by backend 'sqlite'")
        return self

    def resolved_path(self, base: Path | None = None) -> Path:
        """The SQLite path, relative paths resolved against ``base`` (the config's folder)."""
        path = self.path or Path(".marsys_mem/memory.db")
        if not path.is_absolute() and base is not None:
            path = base / path
        return path


_SUMMARIZE_ONLY = ("keep_recent", "summary_max_tokens")


def _merge_context(defaults: dict[str, Any], override: dict[str, Any] | None) -> dict[str, Any]:
    merged = dict(defaults)
    if override:
        if "strategy" in override and override["strategy"] != defaults.get("strategy"):
            for key in _SUMMARIZE_ONLY:
                if key not in override:
                    merged.pop(key, None)
        merged.update(override)
    return merged


class MemoryConfig(BaseModel):
    """A whole config file: store, defaults and per-agent policies.

    Example:
        >>> cfg = MemoryConfig.model_validate({
        ...     "version": 1,
        ...     "defaults": {"retention": "session", "context": {"max_tokens": 8000}},
        ...     "agents": {"researcher": {"retention": "persistent", "ttl": "30d",
        ...                               "context": {"max_tokens": 4000}}},
        ... })
        >>> p = cfg.policy_for("researcher")
        >>> p.retention, p.context.max_tokens, cfg.policy_for("anyone").retention
        ('persistent', 4000, 'session')
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = 1
    store: StoreConfig = Field(default_factory=StoreConfig)
    defaults: RetentionPolicy = Field(default_factory=RetentionPolicy)
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    _source: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _resolve_agents(self) -> MemoryConfig:
        for name in self.agents:
            if not name:
                raise ValueError("agent names must be non-empty")
            self.policy_for(name)  # merged policies must validate too
        return self

    def policy_for(self, agent: str) -> RetentionPolicy:
        """The agent's effective policy (defaults for an agent not listed)."""
        override = self.agents.get(agent)
        if override is None:
            return self.defaults
        base = self.defaults
        defaults_ctx = base.context.model_dump(exclude_unset=True)
        fields: dict[str, Any] = {
            "retention": override.retention or base.retention,
            "ttl": override.ttl if override.ttl is not None else base.ttl,
            "max_stored_messages": (
                override.max_stored_messages
                if override.max_stored_messages is not None
                else base.max_stored_messages
            ),
        }
        try:
            context = ContextPolicy.model_validate(_merge_context(defaults_ctx, override.context))
        except ValidationError as exc:
            raise ValueError(
                f"agents.{agent}.context: " + format_validation_error(exc, prefix="")
            ) from None
        patterns = base.patterns
        if override.patterns is not None:
            merged = {**base.patterns.model_dump(exclude_unset=True), **override.patterns}
            try:
                patterns = PatternsConfig.model_validate(merged)
            except ValidationError as exc:
                raise ValueError(
                    f"agents.{agent}.patterns: " + format_validation_error(exc, prefix="")
                ) from None
        return RetentionPolicy(context=context, patterns=patterns, **fields)

    @property
    def source(self) -> Path | None:
        """The file this config was loaded from, if any."""
        return self._source

    @property
    def base_dir(self) -> Path | None:
        """Folder of the file this config came from (for relative store paths)."""
        return self._source.parent if self._source is not None else None


def format_validation_error(exc: ValidationError, *, prefix: str = "") -> str:
    """One line per error: ``field.path: message (got value)``."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        got = err.get("input")
        shown = "" if isinstance(got, dict) or err["type"] == "missing" else f" (got {got!r})"
        lines.append(f"{prefix}{loc}: {msg}{shown}" if loc else f"{prefix}{msg}")
    return "; ".join(lines)


def _read(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(f"{path}:{where}: invalid YAML: {problem}") from exc
    if suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path}: line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}"
            ) from exc
    raise ConfigError(f"{path}: unknown config format {suffix!r}; use .yaml, .yml, .toml or .json")


def load_config(path: str | Path) -> MemoryConfig:
    """Load and validate a config file (YAML, TOML or JSON, by extension).

    Raises:
        ConfigError: the file is missing, unparsable or invalid; the message names the
            file, the field path and the bad value.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "team.json"
        >>> _ = path.write_text('{"agents": {"researcher": {"retention": "persistent"}}}')
        >>> load_config(path).agents["researcher"].retention
        'persistent'
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    data = _read(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    try:
        config = MemoryConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {format_validation_error(exc)}") from None
    config._source = path.resolve()
    return config
