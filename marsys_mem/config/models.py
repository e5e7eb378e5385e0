"""Retention policies and the config file format.

A config file (YAML, TOML or JSON) says where memory is stored and, per agent, its
retention (``single_run``, ``session`` or ``persistent``), ``ttl``, ``max_stored_messages``
and context policy: the defaults overridden field by field. A SQLite store without a path
lives in the user's data folder, never beside the config file; a relative path resolves
against the file's folder. Errors are :class:`~marsys_mem.exceptions.ConfigError` naming
the file, the field path and the bad value.

Guide: ``docs/guides/retention-and-stores.md#retention-policy-files``.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import InitErrorDetails, PydanticCustomError

from marsys_mem.config.coordination import CoordinatorSettings
from marsys_mem.config.files import short_repr
from marsys_mem.config.schema_forms import AlsoAccepts, SchemaAs, SchemaOf
from marsys_mem.context.compose import BudgetSplit
from marsys_mem.context.policy import ContextPolicy
from marsys_mem.exceptions import ConfigError
from marsys_mem.model.hnsw import HnswSettings, VectorIndex
from marsys_mem.model.names import NAME_PATTERN
from marsys_mem.model.ranking import Ingest, Ranking

__all__ = [
    "DATA_DIR_ENV",
    "PG_DSN_ENV",
    "AgentConfig",
    "CrossThreadConfig",
    "Duration",
    "EpisodicPatternConfig",
    "FactsPatternConfig",
    "HierarchicalPatternConfig",
    "LLMConfig",
    "LLMProvider",
    "MemoryConfig",
    "PatternsConfig",
    "PoolConfig",
    "RagPatternConfig",
    "RetentionKind",
    "RetentionPolicy",
    "StoreConfig",
    "default_data_dir",
    "default_store_path",
    "format_validation_error",
    "parse_duration",
]

RetentionKind = Literal["single_run", "session", "persistent"]

DATA_DIR_ENV = "MARSYS_MEM_HOME"
"""Environment variable naming the folder of the default store (see :func:`default_data_dir`)."""


def default_data_dir() -> Path:
    """The folder of stores configured without a path (the user's data folder).

    ``$MARSYS_MEM_HOME`` when set; else ``$XDG_DATA_HOME/marsys-mem`` (when absolute) or
    ``~/.local/share/marsys-mem``; on Windows ``%LOCALAPPDATA%/marsys-mem``, on macOS
    ``~/Library/Application Support/marsys-mem``. Never inside a source checkout.

    Example:
        >>> default_data_dir().is_absolute()
        True
    """
    home = os.environ.get(DATA_DIR_ENV)
    if home:
        return Path(home).expanduser().absolute()
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        base = Path(local) if local else Path.home() / "AppData" / "Local"
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        xdg = os.environ.get("XDG_DATA_HOME")
        base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "marsys-mem"


def default_store_path() -> Path:
    """The SQLite file of a store configured without a path: ``default_data_dir()/memory.db``.

    Projects sharing it are kept apart by ``store.namespace``.

    Example:
        >>> default_store_path().name
        'memory.db'
    """
    return default_data_dir() / "memory.db"


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


def parse_duration(value: object) -> timedelta:
    """Parse ``30d``, ``12h``, ``1d12h``, ``90m``, ``45s``, ``2w``, seconds, or a timedelta.

    ISO 8601 durations (``PT2S``, ``P30D``, ``P1DT12H``) are read too: that is how a
    config dumped with ``model_dump_json()`` writes them, so it loads again.

    Raises:
        ValueError: anything else, a duration that is not positive, not finite, or longer
            than ``timedelta`` can hold (999,999,999 days).
    """
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, bool):
        raise ValueError(f"invalid duration {short_repr(value)}")
    elif isinstance(value, int | float):
        result = _from_seconds(value, value)
    elif isinstance(value, str) and value.strip().upper().startswith(("P", "-P")):
        result = _from_iso(value)
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
                f"invalid duration {short_repr(value)}: use a number and a unit s/m/h/d/w, "
                "e.g. 30d, 12h, 1d12h"
            )
        result = _from_seconds(seconds, value)
    else:
        raise ValueError(
            f"invalid duration {short_repr(value)}: expected a string like '30d' or seconds"
        )
    if result <= timedelta(0):
        raise ValueError(f"duration must be positive, got {short_repr(value)}")
    return result


_MAX_SECONDS = timedelta.max.total_seconds()
_ISO_DURATION: TypeAdapter[timedelta] = TypeAdapter(timedelta)


def _from_iso(value: str) -> timedelta:
    """An ISO 8601 duration (``PT2S``, ``P30D``, ``P1DT12H``: what ``model_dump_json`` writes)."""
    try:
        return _ISO_DURATION.validate_python(value.strip().upper())
    except ValidationError:
        raise ValueError(
            f"invalid duration {short_repr(value)}: an ISO 8601 duration is written like "
            "PT2S, P30D or P1DT12H"
        ) from None


def _from_seconds(seconds: float, value: object) -> timedelta:
    """``timedelta(seconds=...)`` with NaN, infinity and overflow as ``ValueError``."""
    if isinstance(seconds, float) and math.isnan(seconds):
        raise ValueError(f"invalid duration {short_repr(value)}: not a number")
    if abs(seconds) > _MAX_SECONDS:  # also infinity; an int is compared exactly
        raise ValueError(
            f"duration {short_repr(value)} is too long: at most 999999999 days "
            "(leave ttl unset to keep messages forever)"
        )
    try:
        return timedelta(seconds=seconds)
    except OverflowError:  # rounding at the very edge of the range
        raise ValueError(f"duration {short_repr(value)} is too long") from None


_ISO_PATTERN = (
    r"^\s*-?[Pp](?=[^Tt]*\d|.*[Tt]\d)(\d+(\.\d+)?[YyMmWwDd])*"
    r"([Tt](\d+(\.\d+)?[HhMmSs])*)?\s*$"
)
"""An ISO 8601 duration in the JSON Schema (``PT2S``, ``P30D``, ``P1DT12H``)."""

Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    SchemaAs(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^\s*(\d+(\.\d+)?\s*[smhdwSMHDW]\s*)+$"},
                {"type": "string", "pattern": _ISO_PATTERN},
                {"type": "number", "exclusiveMinimum": 0},
            ]
        }
    ),
]
"""A positive duration, written ``30d``, ``12h``, ``1d12h``, as seconds or in ISO 8601."""


def _enabled(value: object) -> object:
    """``true`` enables a pattern with its defaults; ``false`` disables it."""
    if value is True:
        return {}
    if value is False:
        return None
    return value


_OR_BOOL = AlsoAccepts({"type": "boolean"})
_PRESET_NAME = AlsoAccepts({"enum": list(Ranking.presets())})
_MOVED_TO_RANKING = ("mode", "dense_weight", "bm25_weight")


class RagPatternConfig(BaseModel):
    """Retrieval over the agent's history (``patterns.rag``).

    ``keep``: ``source`` (default) keeps an entry as long as its message stays in the
    conversation (ttl, ``max_stored_messages``, forget and the end of a session remove
    both); ``archive`` keeps entries beyond the conversation's bound, as an archive, up to
    its own ``max_stored_messages`` and ``ttl`` (default: the agent's ttl). Forget always
    reaches the archive. ``min_score``: hits whose calibrated score (the one scale of every
    search, a probability of relevance) is below it are left out; ``null`` keeps all.
    ``ranking``: how searches rank (:class:`~marsys_mem.model.ranking.Ranking`): a
    preset's name (``conversation``, the default, or ``notes``) or a mapping of its
    fields, with an optional ``preset`` the others start from. ``ingest``: how messages
    are taken in (:class:`~marsys_mem.model.ranking.Ingest`). ``mode``, ``dense_weight``
    and ``bm25_weight`` written beside ``k`` (as before ``ranking`` held them) are read
    as fields of ``ranking``.

    Example:
        >>> RagPatternConfig(k=4, ranking="notes").ranking.context_turns
        0
        >>> ranking = {"preset": "notes", "diversity": 0.1}
        >>> cfg = RagPatternConfig.model_validate({"ranking": ranking})
        >>> cfg.ranking.preset, cfg.ranking.diversity, cfg.ingest.background
        ('notes', 0.1, True)
        >>> RagPatternConfig.model_validate({"mode": "bm25"}).ranking.mode
        'bm25'
        >>> RagPatternConfig(keep="archive", max_stored_messages=100_000).keep
        'archive'
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", json_schema_extra=lambda schema: _beside_k(schema)
    )

    k: int = Field(default=4, ge=1, le=100)
    # calibration.DEFAULT_MIN_SCORE (retrieval is a sibling layer: not imported here)
    min_score: float | None = 0.8
    ranking: Annotated[Ranking, _PRESET_NAME] = Field(default_factory=Ranking)
    ingest: Ingest = Field(default_factory=Ingest)
    keep: Literal["source", "archive"] = "source"
    max_stored_messages: int | None = Field(default=None, ge=1)
    ttl: Duration | None = None

    @model_validator(mode="before")
    @classmethod
    def _ranking_fields_beside_k(cls, data: object) -> object:
        """``mode``, ``dense_weight``, ``bm25_weight`` beside ``k``: fields of ``ranking``."""
        if not isinstance(data, Mapping):
            return data
        moved = {name: data[name] for name in _MOVED_TO_RANKING if name in data}
        if not moved:
            return data
        rest = {key: value for key, value in data.items() if key not in moved}
        ranking = data.get("ranking", {})
        if isinstance(ranking, str):
            ranking = {"preset": ranking}
        if isinstance(ranking, Ranking):
            ranking = ranking.model_dump()
        if not isinstance(ranking, Mapping):
            return data  # the ranking's own check names it
        both = sorted(set(moved) & set(ranking))
        if both:
            raise ValueError(
                f"{both[0]} is given twice, beside k and in ranking: keep the one in ranking"
            )
        return {**rest, "ranking": {**ranking, **moved}}

    @model_validator(mode="after")
    def _archive_only(self) -> RagPatternConfig:
        if self.keep == "source" and (self.max_stored_messages is not None or self.ttl):
            raise ValueError(
                "max_stored_messages and ttl of patterns.rag apply to an archive: set "
                "keep: archive (with keep: source, entries live as long as their messages)"
            )
        return self


def _beside_k(schema: dict[str, Any]) -> None:
    """The JSON Schema of ``patterns.rag`` accepts the ranking fields read beside ``k``."""
    fields = Ranking.model_json_schema()["properties"]
    for name in _MOVED_TO_RANKING:
        shown = {key: value for key, value in fields[name].items() if key != "default"}
        schema["properties"][name] = {**shown, "description": f"read as ranking.{name}"}


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


class FactsPatternConfig(BaseModel):
    """Facts learned about a subject from the conversation (``patterns.facts``).

    Every user message the agent's memory appends goes to a background extraction pipeline
    (``add`` never waits); the facts it learns show as a "user facts" block in
    ``MemoryManager.context_for``. ``extractor``: ``offline`` (fixed first-person patterns,
    no model) or ``llm`` (the manager's ``llm``, one call per batch). ``subject``: whom the
    facts are about. ``k``: most facts in the block; facts whose calibrated score for the
    query is ``min_score`` or more (the one default of every search: 0.8) come first, then
    the others by confidence.

    Example:
        >>> cfg = FactsPatternConfig.model_validate({"subject": "alice", "extractor": "llm"})
        >>> cfg.enabled, cfg.subject, cfg.extractor, cfg.debounce
        (True, 'alice', 'llm', 2.0)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    subject: str = Field(default="user", pattern=NAME_PATTERN)
    extractor: Literal["offline", "llm"] = "offline"
    debounce: float = Field(default=2.0, ge=0.0, le=3600.0)
    max_batch: int = Field(default=32, ge=1, le=10_000)
    k: int = Field(default=10, ge=1, le=200)
    min_score: float = Field(default=0.8, ge=-1.0, le=1.0)  # calibration.DEFAULT_MIN_SCORE
    maintain: bool = False


def _on_off(value: object) -> object:
    """``true`` / ``false`` for a setting that is on by default."""
    if isinstance(value, bool):
        return {"enabled": value}
    return value


class CrossThreadConfig(BaseModel):
    """Recall from the subject's other conversations (``patterns.threads``).

    Used by ``MemoryManager.context_for(agent, query, subject=...)``: messages of the
    subject's other threads (conversations with them, any agent or branch), ranked by
    hybrid retrieval, whose cosine to ``query`` is ``min_score`` or more (see
    :class:`~marsys_mem.patterns.threads.CrossThreadRecall` for how 0.3 was chosen), at
    most ``k``, in a block under ``budget.threads``. On by default; ``threads: false``
    turns it off.

    Example:
        >>> CrossThreadConfig.model_validate(False).enabled
        False
        >>> CrossThreadConfig(k=3).min_score
        0.3
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    k: int = Field(default=4, ge=1, le=100)
    min_score: float = Field(default=0.3, ge=-1.0, le=1.0)

    @model_validator(mode="before")
    @classmethod
    def _bool(cls, value: object) -> object:
        return _on_off(value)


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
    rag: Annotated[RagPatternConfig | None, BeforeValidator(_enabled), _OR_BOOL] = None
    episodic: Annotated[EpisodicPatternConfig | None, BeforeValidator(_enabled), _OR_BOOL] = None
    hierarchical: Annotated[
        HierarchicalPatternConfig | None, BeforeValidator(_enabled), _OR_BOOL
    ] = None
    facts: Annotated[FactsPatternConfig | None, BeforeValidator(_enabled), _OR_BOOL] = None
    threads: Annotated[CrossThreadConfig, _OR_BOOL] = Field(default_factory=CrossThreadConfig)
    budget: BudgetSplit = Field(default_factory=BudgetSplit)

    @property
    def any(self) -> bool:
        """True if some retrieval pattern is enabled."""
        return any(p is not None for p in (self.rag, self.episodic, self.hierarchical))

    @property
    def learns_facts(self) -> bool:
        """True if ``facts`` is set and enabled."""
        return self.facts is not None and self.facts.enabled


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
    context: Annotated[dict[str, Any], SchemaOf(ContextPolicy)] | None = None
    patterns: Annotated[dict[str, Any], SchemaOf(PatternsConfig)] | None = None


PG_DSN_ENV = "MARSYS_MEM_PG_DSN"
"""The environment variable a ``postgres`` store reads its DSN from by default."""

_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class PoolConfig(BaseModel):
    """The connection pool of a ``postgres`` store: ``min`` kept open, ``max`` at most.

    Example:
        >>> PoolConfig(min=2, max=20).max
        20
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    min: int = Field(default=1, ge=0, le=1000)
    max: int = Field(default=10, ge=1, le=1000)

    @model_validator(mode="after")
    def _check(self) -> PoolConfig:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class StoreConfig(BaseModel):
    """Where persistent memory lives.

    ``backend``: ``memory`` (nothing survives the process), ``sqlite`` (``path``; relative
    to the config file's folder; without one, :func:`default_store_path` in the user's data
    folder) or ``postgres`` (one database shared by many hosts: ``dsn``, or, so that no
    password sits in a file, the environment variable named by ``dsn_env``, by default
    ``MARSYS_MEM_PG_DSN``; ``pool``: connections per process; ``vector_index``: the vector
    index's settings where the database has pgvector,
    :class:`~marsys_mem.model.hnsw.HnswSettings` or, with ``kind: ivfflat``,
    :class:`~marsys_mem.model.hnsw.IvfSettings`). ``namespace`` separates projects
    sharing a store.

    Example:
        >>> StoreConfig(backend="sqlite", path="mem.db").namespace
        'default'
        >>> StoreConfig(backend="postgres", pool={"min": 1, "max": 4}).dsn_env
        'MARSYS_MEM_PG_DSN'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["memory", "sqlite", "postgres"] = "memory"
    path: Path | None = None
    namespace: str = Field(default="default", pattern=NAME_PATTERN)  # marsys_mem.model.names
    dsn: SecretStr | None = Field(default=None, min_length=1)
    dsn_env: str = Field(default=PG_DSN_ENV, pattern=_ENV_NAME)
    pool: PoolConfig = PoolConfig()
    connect_timeout: float = Field(default=10.0, gt=0, le=3600)
    vector_index: VectorIndex = HnswSettings()

    @model_validator(mode="after")
    def _check(self) -> StoreConfig:
        if self.backend != "sqlite" and self.path is not None:
            raise ValueError(f"path is only used by backend 'sqlite', not {self.backend!r}")
        if self.backend != "postgres":
            for name in ("dsn", "dsn_env", "pool", "connect_timeout", "vector_index"):
                # a default written out (as model_dump writes every field) is no setting
                default = type(self).model_fields[name].default
                if name in self.model_fields_set and getattr(self, name) != default:
                    raise ValueError(
                        f"{name} is only used by backend 'postgres', not {self.backend!r}"
                    )
        return self

    @property
    def is_durable(self) -> bool:
        """Whether what is written outlives the process (``sqlite`` or ``postgres``)."""
        return self.backend in ("sqlite", "postgres")

    def resolved_dsn(self, environ: Mapping[str, str] | None = None) -> str:
        """The DSN of a ``postgres`` store: ``dsn``, else the ``dsn_env`` variable.

        Raises:
            ConfigError: neither is set (the message names both, never a value).
        """
        if self.dsn is not None:
            return self.dsn.get_secret_value()
        value = (os.environ if environ is None else environ).get(self.dsn_env, "")
        if not value.strip():
            raise ConfigError(
                f"store.dsn: backend 'postgres' needs a DSN: set store.dsn, or the "
                f"environment variable {self.dsn_env} (store.dsn_env), to "
                "postgresql://user@host:port/dbname"
            )
        return value

    def resolved_path(self, base: Path | None = None) -> Path:
        """The SQLite file: ``path``, or :func:`default_store_path` when none is set.

        ``~`` is expanded; a relative path is resolved against ``base`` (the config's folder).
        """
        if self.path is None:
            return default_store_path()
        path = self.path.expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        return path


LLMProvider = Literal["openai", "anthropic", "azure"]
"""Who serves the model: ``openai`` (also any OpenAI-compatible server by ``base_url``),
``anthropic`` or ``azure`` (Azure OpenAI)."""

_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class _FromFile(BaseModel):
    """A model that remembers the file it was read from (trusted when built in code).

    Validated with the context ``{"source": path}`` (as the file loaders do), :attr:`source`
    is that file; validated or built without it, ``None``.
    """

    _source: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _remember_source(self, info: ValidationInfo) -> Self:
        """The validation context's ``"source"`` (the file read) becomes :attr:`source`."""
        source = info.context.get("source") if isinstance(info.context, dict) else None
        if source is not None:
            self._source = Path(source)
        return self

    @property
    def source(self) -> Path | None:
        """The file this was read from; ``None``: built in code (trusted)."""
        return self._source


class LLMConfig(_FromFile):
    """The model a workflow's ``ask`` steps (and ``patterns.facts.extractor: llm``) call.

    An ``llm:`` section of a workflow or policy file. The API key never sits in the file:
    ``api_key_env`` names the environment variable that holds it (default:
    ``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY`` or ``AZURE_OPENAI_API_KEY``; a ``base_url``
    server with ``provider: openai`` needs none: local servers ignore the key).
    ``base_url``: an OpenAI-compatible server (vLLM, Ollama, llama.cpp, LM Studio), an
    Anthropic gateway, or, for ``azure``, the resource endpoint (with ``api_version``;
    ``model`` is then the deployment). ``timeout``: seconds per HTTP attempt;
    ``max_retries``: retries on 408/409/429/5xx, timeouts and connection errors, with
    backoff. The adapter is built by :func:`marsys_mem.llm.factory.make_llm`.

    A section read from a file records it (:attr:`source`, from the validation context
    ``{"source": path}``, as :class:`MemoryConfig`): a file is not trusted to choose the
    key's variable or the server it goes to (:mod:`marsys_mem.llm.trust`); a config built
    in code is trusted code.

    Example:
        >>> cfg = LLMConfig.model_validate({"provider": "openai", "model": "llama3.2",
        ...                                 "base_url": "http://localhost:11434/v1"})
        >>> cfg.provider, cfg.api_key_env, cfg.timeout, cfg.source
        ('openai', None, 60.0, None)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: LLMProvider = "openai"
    model: str = Field(min_length=1, max_length=200, description="Model (Azure: deployment).")
    base_url: str | None = Field(
        default=None,
        pattern=r"^https?://\S+$",
        description="OpenAI-compatible server, Anthropic gateway, or the Azure endpoint.",
    )
    api_key_env: str | None = Field(
        default=None,
        pattern=_ENV_NAME,
        description="NAME of the environment variable holding the API key (never the key).",
    )
    api_version: str | None = Field(
        default=None, min_length=1, description="Azure OpenAI API version (azure only)."
    )
    timeout: float = Field(default=60.0, gt=0, le=3600, description="Seconds per attempt.")
    max_retries: int = Field(default=2, ge=0, le=10)
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    api_key: SkipJsonSchema[Any] = Field(default=None, exclude=True, repr=False)

    @field_validator("api_key")
    @classmethod
    def _no_key_in_file(cls, value: object) -> None:
        """``api_key:`` is refused with a hint (a key in a file leaks with the file)."""
        raise ValidationError.from_exception_data(
            "api_key",
            [
                InitErrorDetails(
                    type=PydanticCustomError(
                        "value_error",
                        "never put an API key in a file: set it in an environment variable "
                        "and name that variable with api_key_env",
                    ),
                    loc=(),
                    input="<hidden>",
                )
            ],
        )

    @field_validator("api_key_env", mode="before")
    @classmethod
    def _a_name_not_a_key(cls, value: Any) -> Any:
        """Not an environment variable's name: probably a key, so its value is not shown."""
        if isinstance(value, str) and not re.match(_ENV_NAME, value):
            raise ValidationError.from_exception_data(
                "api_key_env",
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "value_error",
                            "api_key_env is the NAME of an environment variable (like "
                            "OPENAI_API_KEY), not the key itself",
                        ),
                        loc=(),
                        input="<hidden>",
                    )
                ],
            )
        return value

    @field_validator("base_url", mode="before")
    @classmethod
    def _http_url(cls, value: Any) -> Any:
        if isinstance(value, str) and not re.match(r"^https?://\S+$", value):
            raise ValueError("base_url must be an http(s) URL such as http://localhost:11434/v1")
        return value

    @model_validator(mode="after")
    def _azure(self) -> Self:
        errors: list[InitErrorDetails] = []

        def error(loc: str, message: str, value: object) -> None:
            errors.append(
                InitErrorDetails(
                    type=PydanticCustomError("value_error", message), loc=(loc,), input=value
                )
            )

        if self.provider == "azure":
            if self.base_url is None:
                error("base_url", "provider 'azure' needs base_url: the resource endpoint", None)
            if self.api_version is None:
                error("api_version", "provider 'azure' needs api_version (e.g. 2024-10-21)", None)
        elif self.api_version is not None:
            error("api_version", "api_version is only used by provider 'azure'", self.api_version)
        if errors:
            raise ValidationError.from_exception_data("LLMConfig", errors)
        return self


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


def _error_details(
    exc: ValidationError, prefix: tuple[str, ...] = (), *, fields_only: bool = False
) -> list[InitErrorDetails]:
    """``exc``'s errors, under ``prefix``, to raise again as part of a larger error."""
    return [
        InitErrorDetails(
            type=PydanticCustomError(err["type"], err["msg"]),
            loc=(*prefix, *err["loc"]),
            input=err["input"],
        )
        for err in exc.errors(include_url=False)
        if err["loc"] or not fields_only
    ]


def _merge_errors(name: str, raw: object, defaults: object) -> list[InitErrorDetails]:
    """Errors of an agent's context and patterns merged over the defaults (as ``policy_for``).

    With invalid defaults only the override's own fields are checked.
    """
    if isinstance(raw, AgentConfig):
        context, patterns = raw.context, raw.patterns
    elif isinstance(raw, dict):
        context, patterns = raw.get("context"), raw.get("patterns")
    else:
        return []
    base = defaults if isinstance(defaults, RetentionPolicy) else None
    out: list[InitErrorDetails] = []
    if isinstance(context, dict):
        ctx = base.context.model_dump(exclude_unset=True) if base is not None else {}
        try:
            ContextPolicy.model_validate(_merge_context(ctx, context))
        except ValidationError as exc:
            out += _error_details(exc, (name, "context"), fields_only=base is None)
    if isinstance(patterns, dict):
        pat = base.patterns.model_dump(exclude_unset=True) if base is not None else {}
        try:
            PatternsConfig.model_validate({**pat, **patterns})
        except ValidationError as exc:
            out += _error_details(exc, (name, "patterns"), fields_only=base is None)
    return out


class MemoryConfig(_FromFile):
    """A whole config file: store, defaults, per-agent policies, the model, coordination.

    ``coordination`` is a :class:`~marsys_mem.config.CoordinatorSettings`: the settings
    every :class:`~marsys_mem.coordination.Coordinator` made over this config's manager
    uses (the front door's and a workflow's).

    :func:`load_config` records the file a config came from (:attr:`source`, and
    :attr:`base_dir` for relative store paths) by validating with the context
    ``{"source": path}``; a config validated without it has no source.

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
    llm: LLMConfig | None = Field(
        default=None, description="The model agents use (ask steps, fact extraction)."
    )
    coordination: CoordinatorSettings = Field(
        default_factory=CoordinatorSettings,
        description="The coordinator's tuning numbers (payload size, ordering, repair).",
    )

    @field_validator("agents", mode="wrap")
    @classmethod
    def _check_agents(
        cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> dict[str, AgentConfig]:
        """Merged policies must validate too; every error is reported, each at its field."""
        errors: list[InitErrorDetails] = []
        agents: dict[str, AgentConfig] = {}
        try:
            agents = handler(value)
        except ValidationError as exc:
            errors.extend(_error_details(exc))
        defaults = info.data.get("defaults")
        for name, raw in value.items() if isinstance(value, dict) else ():
            if name == "":
                errors.append(
                    InitErrorDetails(
                        type=PydanticCustomError("value_error", "agent names must be non-empty"),
                        loc=(),
                        input=value,
                    )
                )
            elif isinstance(name, str):
                errors.extend(_merge_errors(name, raw, defaults))
        if errors:
            raise ValidationError.from_exception_data("agents", errors)
        return agents

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
    def base_dir(self) -> Path | None:
        """Folder of the file this config came from (for relative store paths)."""
        return self._source.parent if self._source is not None else None


_MAX_ERRORS = 20


def format_validation_error(exc: ValidationError, *, prefix: str = "") -> str:
    """One line per error: ``field.path: message (got value)``.

    Values and long keys are shortened (:func:`~marsys_mem.config.files.short_repr`) and
    at most 20 errors are listed, so a message stays readable whatever the file holds.
    """
    errors = exc.errors(include_url=False)
    lines = []
    for err in errors[:_MAX_ERRORS]:
        loc = ".".join(_short_part(p) for p in err["loc"])
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        got = err.get("input")
        shown = (
            "" if isinstance(got, dict) or err["type"] == "missing" else f" (got {short_repr(got)})"
        )
        lines.append(f"{prefix}{loc}: {msg}{shown}" if loc else f"{prefix}{msg}")
    if len(errors) > _MAX_ERRORS:
        lines.append(f"{prefix}... and {len(errors) - _MAX_ERRORS} more errors")
    return "; ".join(lines)


def _short_part(part: object) -> str:
    text = str(part)
    return text if len(text) <= 60 else short_repr(text, 60)
