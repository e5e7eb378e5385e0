"""How a RAGMemory ranks and how it ingests: two frozen settings models, with named presets.

:class:`Ranking` holds every knob of the ranking (the retrievers, their fusion, the
conversation cues); :class:`Ingest` how messages are taken in (embedding in the
background, batch size, backpressure, the vector index). Each is the one source of its
defaults: the constructor argument of :class:`~marsys_mem.patterns.rag.RAGMemory`, the
``patterns.rag.ranking`` and ``patterns.rag.ingest`` sections of a policy file, and what
:func:`~marsys_mem.retrieval.scoring.rank_candidates` reads. A ranking starts from a named
preset (:data:`PRESETS`) and overrides any field.

Guide: ``docs/guides/patterns.md#rag-search-in-depth``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, Self, TypedDict, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["PRESETS", "Ingest", "PresetName", "RagOptions", "Ranking", "resolve_settings"]

PresetName = Literal["conversation", "notes"]
"""The names of :class:`Ranking`'s presets."""

PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "conversation": MappingProxyType({}),
        "notes": MappingProxyType(
            {
                "dense_weight": 1.5,
                "context_turns": 0,
                "thread_weight": 0.0,
                "speaker_weight": 0.0,
                "strip_names": False,
                "index_names": False,
                "question_weight": 0.0,
                "first_person": False,
                "answer_weight": 0.0,
                "self_weight": 0.0,
            }
        ),
    }
)
"""Each preset's fields that differ from :class:`Ranking`'s defaults (``conversation``)."""


class Ranking(BaseModel):
    """How a hybrid search ranks: retrievers, fusion and conversation cues, with presets.

    The defaults are the ``conversation`` preset, tuned on real two-person chats
    (REALTALK's tune split; ``benchmarks/bench_realtalk.py``). A ranking is made from a
    preset and overrides: ``Ranking(preset="notes", dense_weight=1.2)``,
    ``Ranking.of("notes", dense_weight=1.2)``, or in a file ``ranking: notes`` /
    ``ranking: {preset: notes, dense_weight: 1.2}``; the fields not given come from the
    preset. Presets (:data:`PRESETS`):

    * ``conversation`` (the defaults): messages of people talking, in threads and
      sessions. A reply is found through the turn it answers (``context_*``), the
      conversation a query is about ranks above look-alike lines of others
      (``thread_weight``), a query naming one participant prefers that participant's own
      turns and is searched without the participants' names (``speaker_weight``,
      ``strip_names``) as that participant would ask it (``first_person``), turns that
      ask rank a little below turns that tell, the turn after another speaker's question
      is lent more of its match (``answer_weight``), and turns in which the speaker
      tells about themselves rank a little higher (``self_weight``).
    * ``notes``: independent texts (documents, notes, facts, tool outputs) with no
      speakers and no conversation around them. Every cue that reads neighbours, threads,
      speakers or questions is off (they only add noise when the texts are unrelated),
      and the dense side weighs 1.5: on the independent planted facts of
      ``benchmarks/bench_retrieval.py`` ``context_turns=0, dense_weight=1.5`` ranked
      best. The time cues stay on (a note's timestamp is when it was written).

    Attributes:
        preset: the preset the fields not given come from.
        mode: the default retrieval, ``"hybrid"``, ``"dense"`` or ``"bm25"``.
        fusion: how the two sides are fused: ``"zscore"`` (standard scores), ``"minmax"``
            (min-max normalised scores), ``"convex"`` (raw scores) or ``"rrf"`` (ranks).
            Score fusion keeps an exact match on a rare word (a code, an id) on top,
            where RRF's ranks throw away how much better the best matches are.
        dense_weight: weight of the dense side in the fusion (1.3: with the
            participants' names out of the query, REALTALK's tune chats found more with
            the dense side weighed up).
        bm25_weight: weight of the keyword side (not both weights 0).
        rrf_k: the reciprocal rank fusion constant (larger: flatter), for ``"rrf"``.
        candidates: how many candidates each retriever proposes (at least ``k``; widened
            when filters reject candidates).
        context_candidates: on a store that searches (PostgreSQL with pgvector), read
            the turns around only each side's best ``context_candidates`` candidates;
            the others are ranked on their own scores and their thread's, without
            neighbours. ``None`` (the default): around every candidate, as the in-process
            ranker does (where reading them costs nothing). Fewer turns read is faster
            and finds less: on a 100k-message store of ``benchmarks/bench_scale.py``'s
            corpus, 30 read about 3x fewer turns, searched in 21.4 ms instead of 30.4
            (hybrid p50; at 1M 26.8 instead of 41.0) and found 0.736 of the evidence
            turns instead of 0.773 (50: 24.2 ms and 0.745).
        k1: BM25 term-frequency saturation.
        b: BM25 length normalisation (0 to 1).
        thread_key: the metadata field naming a message's conversation thread (messages
            without it share one thread); ``None``: one thread, in the order of adding.
        context_turns: how many preceding turns of its thread a hybrid hit is scored with
            (0 to 8; 0: none, and no reply either).
        context_weight: weight of the previous turn's scores in a message's score (the
            turn before that: its square, and so on).
        reply_weight: weight of the next turn's scores (a question found through its
            answer).
        thread_weight: each candidate gains this share of what its thread's candidates
            score above the candidates' mean on the keyword side.
        diversity: how much a hit is lowered (a share of the best score) for each better
            hit already taken from its session (``metadata["session"]``, else its thread
            and day). 0: off.
        time_weight: bonus (a share of the best score) for messages sent in the period a
            query names ("in July 2023").
        when_weight: bonus for messages that say when, when the query asks when.
        index_names: BM25 indexes the speaker's ``name`` (or ``metadata["agent"]``) with
            the text.
        speaker_weight: bonus for the messages of the one participant a query names (by
            name or by an alias learned from the conversation). 0: off.
        strip_names: a hybrid search looks for the query without the names of the
            conversation's participants (on only while ``speaker_weight`` is).
        question_weight: bonus for messages that do not end with a question mark. 0: off.
        first_person: a hybrid search that takes the names out asks a question about one
            participant as they would ("What are Kate's hobbies?" -> "What are my
            hobbies?"; :func:`~marsys_mem.retrieval.answers.in_first_person`): the turns
            that answer it are that participant's own words.
        answer_weight: how much more of a question's match the turn right after it, by
            another speaker, is lent (on top of ``context_weight``): the answer to a
            question like the query. 0: off.
        self_weight: bonus for messages in which the speaker tells about themselves ("I",
            "my" more than "you", "your"; half for as many;
            :func:`~marsys_mem.retrieval.answers.tells_of_self`). 0: off.

    Example:
        >>> Ranking().dense_weight, Ranking.of("notes").context_turns
        (1.3, 0)
        >>> Ranking.of("notes", dense_weight=1.2).dense_weight
        1.2
        >>> Ranking.model_validate({"preset": "notes", "time_weight": 0}).time_weight
        0.0
        >>> try:
        ...     Ranking(context_turns=9)
        ... except ValueError as exc:
        ...     print(exc.errors()[0]["loc"], exc.errors()[0]["input"])
        ('context_turns',) 9
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    preset: PresetName = "conversation"
    mode: Literal["hybrid", "dense", "bm25"] = "hybrid"
    fusion: Literal["zscore", "rrf", "convex", "minmax"] = "zscore"
    dense_weight: float = Field(default=1.3, ge=0.0)
    bm25_weight: float = Field(default=1.0, ge=0.0)
    rrf_k: int = Field(default=5, ge=0)
    candidates: int = Field(default=100, ge=1)
    context_candidates: int | None = Field(default=None, ge=1)
    k1: float = Field(default=1.5, ge=0.0)
    b: float = Field(default=0.75, ge=0.0, le=1.0)
    thread_key: str | None = Field(default="thread", min_length=1)
    context_turns: int = Field(default=3, ge=0, le=8)
    context_weight: float = Field(default=0.25, ge=0.0)
    reply_weight: float = Field(default=0.25, ge=0.0)
    thread_weight: float = Field(default=0.2, ge=0.0)
    diversity: float = Field(default=0.0, ge=0.0)
    time_weight: float = Field(default=0.5, ge=0.0)
    when_weight: float = Field(default=0.3, ge=0.0)
    index_names: bool = True
    speaker_weight: float = Field(default=0.5, ge=0.0)
    strip_names: bool = True
    question_weight: float = Field(default=0.15, ge=0.0)
    first_person: bool = True
    answer_weight: float = Field(default=0.15, ge=0.0)
    self_weight: float = Field(default=0.1, ge=0.0)

    @model_validator(mode="before")
    @classmethod
    def _from_preset(cls, data: object) -> object:
        """A preset's name, or a mapping: the fields not given come from its ``preset``."""
        if isinstance(data, str):
            data = {"preset": data}
        if not isinstance(data, Mapping):
            return data
        name = data.get("preset", "conversation")
        base = PRESETS.get(name) if isinstance(name, str) else None
        if not base:  # an unknown preset is reported by the field's own check
            return data
        return {**base, **data}

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.dense_weight == 0 and self.bm25_weight == 0:
            raise ValueError("dense_weight and bm25_weight cannot both be 0")
        return self

    @classmethod
    def of(cls, preset: PresetName = "conversation", **overrides: Any) -> Ranking:
        """The preset ``preset`` with ``overrides`` (any field).

        Raises:
            ValueError: an unknown preset or field, or a bad value (named).

        Example:
            >>> Ranking.of("notes", diversity=0.1).diversity
            0.1
        """
        return cls.model_validate({**overrides, "preset": preset})

    @classmethod
    def presets(cls) -> tuple[str, ...]:
        """The names of the presets.

        Example:
            >>> Ranking.presets()
            ('conversation', 'notes')
        """
        return get_args(PresetName)

    def replace(self, **changes: Any) -> Ranking:
        """A copy with ``changes`` (validated; the other fields kept as they are).

        Example:
            >>> Ranking.of("notes").replace(dense_weight=1.0).context_turns
            0
        """
        if not changes:
            return self
        return type(self).model_validate({**self.model_dump(), **changes})

    @property
    def in_context(self) -> bool:
        """Whether a hybrid search scores candidates with the turns around them.

        Example:
            >>> Ranking().in_context, Ranking.of("notes").in_context
            (True, False)
        """
        return bool(self.thread_weight) or (
            bool(self.context_turns) and bool(self.context_weight or self.reply_weight)
        )


class Ingest(BaseModel):
    """How a RAGMemory takes messages in: embedding, batches, backpressure, the vector index.

    Attributes:
        background: embed in a background thread (``add`` never waits for the model).
            ``False``: ``add`` embeds before returning, and a failing embedder makes the
            ``add`` fail with nothing changed. On a store that searches, ``add`` always
            embeds before returning (a message and its vector go in one transaction).
        batch_size: how many texts the embedder gets at a time.
        max_pending: texts that may wait for embedding before ``add`` waits.
        max_chars: the longest text ``add`` accepts.
        index_kind: the :class:`~marsys_mem.retrieval.index.FaissIndex` kind: ``"ivf"``
            (the default: exact below 4,096 messages, then through 4-bit codes scanned in
            full, and from 200,000 through codes split into lists of which a query scans
            an eighth: at 1M chat turns 1.2 ms instead of 6 for the dense side, 0.977 of
            the exact best 10 found), ``"flat"`` (the codes scanned in full at any size:
            0.996 at 1M), ``"hnsw"`` or ``"auto"`` (an HNSW graph from the start, or past
            50k messages: approximate, slow to build, and weak on chat data with many
            near-equal turns).

    Example:
        >>> Ingest().batch_size, Ingest(background=False).background
        (64, False)
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    background: bool = True
    batch_size: int = Field(default=64, ge=1)
    max_pending: int = Field(default=100_000, ge=1)
    max_chars: int = Field(default=100_000, ge=1)
    index_kind: Literal["auto", "flat", "ivf", "hnsw"] = "ivf"

    def replace(self, **changes: Any) -> Ingest:
        """A copy with ``changes`` (validated).

        Example:
            >>> Ingest().replace(batch_size=16).batch_size
            16
        """
        if not changes:
            return self
        return type(self).model_validate({**self.model_dump(), **changes})


class RagOptions(TypedDict, total=False):
    """The fields of :class:`Ranking` (but ``preset``) and :class:`Ingest`, as keywords.

    What ``RAGMemory(embedder, **options)`` accepts on top of its ``ranking`` and
    ``ingest``: each overrides that field (validated by the model; no defaults here).
    """

    mode: Literal["hybrid", "dense", "bm25"]
    fusion: Literal["zscore", "rrf", "convex", "minmax"]
    dense_weight: float
    bm25_weight: float
    rrf_k: int
    candidates: int
    context_candidates: int | None
    k1: float
    b: float
    thread_key: str | None
    context_turns: int
    context_weight: float
    reply_weight: float
    thread_weight: float
    diversity: float
    time_weight: float
    when_weight: float
    index_names: bool
    speaker_weight: float
    strip_names: bool
    question_weight: float
    first_person: bool
    answer_weight: float
    self_weight: float
    background: bool
    batch_size: int
    max_pending: int
    max_chars: int
    index_kind: Literal["auto", "flat", "ivf", "hnsw"]


def resolve_settings(
    ranking: Ranking | str | Mapping[str, Any] | None,
    ingest: Ingest | Mapping[str, Any] | None,
    options: Mapping[str, Any],
    *,
    owner: str = "RAGMemory",
) -> tuple[Ranking, Ingest]:
    """The ranking and ingest settings: ``ranking`` / ``ingest`` with ``options`` on top.

    Args:
        ranking: a :class:`Ranking`, a preset's name, a mapping of its fields (with an
            optional ``preset``), or ``None`` (the defaults).
        ingest: an :class:`Ingest`, a mapping of its fields, or ``None``.
        options: single fields of either model (:class:`RagOptions`), overriding.
        owner: named in the error for an unknown option.

    Raises:
        TypeError: an option that is no field of either model.
        ValueError: a bad value (the error names the field and the value).

    Example:
        >>> r, i = resolve_settings("notes", None, {"dense_weight": 1.0, "batch_size": 8})
        >>> r.preset, r.dense_weight, r.context_turns, i.batch_size
        ('notes', 1.0, 0, 8)
    """
    rank_fields = Ranking.model_fields.keys() - {"preset"}
    unknown = [
        name for name in options if name not in rank_fields and name not in Ingest.model_fields
    ]
    if unknown:
        raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
    rank_over = {k: v for k, v in options.items() if k in rank_fields}
    ingest_over = {k: v for k, v in options.items() if k in Ingest.model_fields}
    if isinstance(ranking, Ranking):
        resolved = ranking.replace(**rank_over)
    elif ranking is None or isinstance(ranking, str):
        resolved = Ranking.model_validate({**rank_over, "preset": ranking or "conversation"})
    elif isinstance(ranking, Mapping):
        resolved = Ranking.model_validate({**ranking, **rank_over})
    else:
        raise TypeError(
            f"ranking must be a Ranking, a preset name or a mapping, got {type(ranking).__name__}"
        )
    if isinstance(ingest, Ingest):
        taken = ingest.replace(**ingest_over)
    elif ingest is None or isinstance(ingest, Mapping):
        taken = Ingest.model_validate({**(ingest or {}), **ingest_over})
    else:
        raise TypeError(f"ingest must be an Ingest or a mapping, got {type(ingest).__name__}")
    return resolved, taken
