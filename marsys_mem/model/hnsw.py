"""How a store that searches in the database builds and searches its vector index.

Two frozen models, one per pgvector index kind: :class:`HnswSettings` (a graph, the
default) and :class:`IvfSettings` (lists of vectors around trained centroids). Either is
the ``vector_index`` argument of :class:`~marsys_mem.store.postgres.PostgresStore` and the
``store.vector_index`` section of a config file (:data:`VectorIndex`: ``kind`` picks one,
``hnsw`` when it is left out). See the guide ``docs/guides/several-hosts.md`` for how to
choose.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, model_validator

__all__ = ["HnswSettings", "IvfSettings", "VectorIndex", "vector_index"]


class HnswSettings(BaseModel):
    """The HNSW index of a store's vectors (pgvector): its graph, and how far a search walks.

    ``m`` and ``ef_construction`` shape the graph, when the index is built (a model's first
    vectors, or :meth:`~marsys_mem.store.postgres.PostgresStore.rebuild_vector_index`): a
    denser graph (higher ``m``) and a wider build (higher ``ef_construction``) find more of
    the true nearest neighbours, at a slower build and a bigger index. ``ef_search`` is how
    many candidates a search keeps while walking the graph (at least twice the hits asked
    for): higher finds more, and costs time on every search. pgvector's defaults are 16, 64
    and 40; these defaults keep pgvector's graph and walk further, which bought the most
    recall per millisecond in ``benchmarks/bench_scale.py``.

    Attributes:
        m: each node's links in the graph (pgvector: 2-100).
        ef_construction: candidates kept while building (pgvector: 4-1000, at least 2m).
        ef_search: candidates kept while searching (pgvector: 1-1000).

    Example:
        >>> HnswSettings().ef_search
        200
        >>> HnswSettings(m=24, ef_construction=128).m
        24
        >>> try:
        ...     HnswSettings(m=32, ef_construction=40)
        ... except ValueError as exc:
        ...     print(exc.errors()[0]["msg"])
        Value error, ef_construction (40) must be at least 2 * m (64), as pgvector requires
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["hnsw"] = "hnsw"
    m: int = Field(default=16, ge=2, le=100, strict=True)
    ef_construction: int = Field(default=64, ge=4, le=1000, strict=True)
    ef_search: int = Field(default=200, ge=1, le=1000, strict=True)

    @model_validator(mode="after")
    def _check(self) -> HnswSettings:
        if self.ef_construction < 2 * self.m:
            raise ValueError(
                f"ef_construction ({self.ef_construction}) must be at least 2 * m "
                f"({2 * self.m}), as pgvector requires"
            )
        return self

    def search_width(self, k: int) -> int:
        """The ``hnsw.ef_search`` for a search of ``k`` hits: this, or 2k, at most 1000.

        Example:
            >>> HnswSettings(ef_search=100).search_width(10), HnswSettings().search_width(800)
            (100, 1000)
        """
        return min(1000, max(self.ef_search, 2 * k))

    def scan_settings(self, k: int) -> dict[str, str]:
        """The session settings that steer a search of ``k`` hits (pgvector's GUCs).

        Example:
            >>> HnswSettings().scan_settings(10)["hnsw.ef_search"]
            '200'
        """
        return {"hnsw.ef_search": str(self.search_width(k)), "hnsw.iterative_scan": "relaxed_order"}


class IvfSettings(BaseModel):
    """An IVFFlat index of a store's vectors (pgvector): trained lists, and how many to scan.

    The index sorts the vectors into ``lists`` lists, each around a centroid trained on the
    vectors there when it is built; a search scans the ``probes`` lists whose centroids are
    nearest the query, exactly. Scanning a share of the vectors holds up where a graph walk
    gets lost: on ``benchmarks/bench_scale.py``'s million chat turns, searched with
    questions (far from every turn, and many turns about as near), 2,000 lists and 80
    probes found 0.945 of the exact top 10 in 17.5 ms, where the HNSW graph found 0.625
    in 6.8 ms and 0.842 at its widest walk; it builds in minutes, not hours.

    The centroids are trained when the index is built, and a store keeps them fitting as
    it grows: once a model has ``train_at`` vectors its index is built, and each time its
    vectors reach ``retrain_at`` times those the lists were trained on, the index is built
    again beside the old one (``CREATE INDEX CONCURRENTLY``; searches use the old one
    meanwhile). One host of a database trains at a time (an advisory lock), on a thread of
    its own, after the writes that passed the mark. Until a model's first index is built
    its searches scan exactly. :meth:`~marsys_mem.store.postgres.PostgresStore.bulk_load`
    builds the index after a load, and
    :meth:`~marsys_mem.store.postgres.PostgresStore.rebuild_vector_index` trains it again
    at any time (after the store's texts drift, say).

    Attributes:
        kind: ``"ivfflat"``.
        lists: the number of lists (pgvector: 1-32768); ``None``: chosen from the model's
            vectors when the index is built (:meth:`lists_for`).
        probes: the lists one search scans (at most ``lists``; the default over fewer lists
            scans them all): recall for time.
        train_at: a model's vectors at which its first index is built (``None``: only
            ``bulk_load`` and ``rebuild_vector_index`` build it).
        retrain_at: the growth, over the vectors its lists were trained on, at which a
            model's index is trained again (``None``: never by itself).

    Example:
        >>> IvfSettings(lists=2000, probes=80).probes
        80
        >>> IvfSettings().lists_for(1_000_000), IvfSettings().lists_for(50_000)
        (1000, 50)
        >>> IvfSettings().due(9_999, None), IvfSettings().due(10_000, None)
        (False, True)
        >>> IvfSettings().due(19_999, 10_000), IvfSettings(retrain_at=None).due(10**6, 10_000)
        (False, False)
        >>> try:
        ...     IvfSettings(lists=10, probes=20)
        ... except ValueError as exc:
        ...     print(exc.errors()[0]["msg"])
        Value error, probes (20) must not exceed lists (10)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["ivfflat"] = "ivfflat"
    lists: int | None = Field(default=None, ge=1, le=32768, strict=True)
    probes: int = Field(default=40, ge=1, le=32768, strict=True)
    train_at: int | None = Field(default=10_000, ge=1, strict=True)
    retrain_at: float | None = Field(default=2.0, gt=1.0, le=1000.0, strict=True)

    @model_validator(mode="after")
    def _check(self) -> IvfSettings:
        # the default probes over fewer lists scan them all; a setting that asks for more is
        # a mistake worth naming
        if (
            self.lists is not None
            and self.probes > self.lists
            and "probes" in self.model_fields_set
        ):
            raise ValueError(f"probes ({self.probes}) must not exceed lists ({self.lists})")
        return self

    def lists_for(self, rows: int) -> int:
        """The lists of an index over ``rows`` vectors: ``lists``, or pgvector's advice.

        pgvector advises rows / 1,000 lists up to a million rows and their square root
        above; at least ``probes`` (a search scans that many).
        """
        if self.lists is not None:
            return self.lists
        advised = rows // 1000 if rows <= 1_000_000 else math.isqrt(rows)
        return max(1, self.probes, min(advised, 32768))

    def due(self, rows: int, trained: int | None) -> bool:
        """Whether a model's index should be built now, over ``rows`` vectors.

        ``trained``: the vectors its lists were trained on (``None``: it has no index).
        """
        if trained is None:
            return self.train_at is not None and rows >= self.train_at
        return self.retrain_at is not None and rows >= self.retrain_at * max(trained, 1)

    def check_every(self) -> int:
        """How many vectors a host writes between two looks at whether training is due.

        A tenth of ``train_at`` (at most 1,000, at least 1): a look counts a model's
        vectors, a few milliseconds per 100,000.

        Example:
            >>> IvfSettings().check_every(), IvfSettings(train_at=50).check_every()
            (1000, 5)
        """
        return max(1, min((self.train_at or 10_000) // 10, 1000))

    def scan_settings(self, k: int) -> dict[str, str]:
        """The session settings that steer a search (pgvector's GUCs; ``k`` does not matter).

        Example:
            >>> IvfSettings(probes=8).scan_settings(10)["ivfflat.probes"]
            '8'
        """
        del k
        return {"ivfflat.probes": str(self.probes), "ivfflat.iterative_scan": "relaxed_order"}


def _hnsw_unless_named(value: Any) -> Any:
    if isinstance(value, Mapping) and "kind" not in value:
        return {"kind": "hnsw", **value}
    return value


VectorIndex = Annotated[
    Annotated[HnswSettings | IvfSettings, Field(discriminator="kind")],
    BeforeValidator(_hnsw_unless_named),
]
"""A store's vector index settings: ``kind`` picks :class:`HnswSettings` (the default, also
when ``kind`` is left out) or :class:`IvfSettings`."""

_ADAPTER: TypeAdapter[HnswSettings | IvfSettings] = TypeAdapter(
    VectorIndex, config=ConfigDict(title="vector_index")
)


def vector_index(
    value: HnswSettings | IvfSettings | Mapping[str, Any] | None,
) -> HnswSettings | IvfSettings:
    """Index settings from a model, a mapping or ``None`` (the default HNSW settings).

    A mapping's ``kind`` is ``"hnsw"`` (also when left out) or ``"ivfflat"``.

    Raises:
        pydantic.ValidationError: a field or value is invalid (named).

    Example:
        >>> vector_index({"kind": "ivfflat", "probes": 8})
        IvfSettings(kind='ivfflat', lists=None, probes=8, train_at=10000, retrain_at=2.0)
        >>> vector_index({"m": 24, "ef_construction": 128}).m
        24
    """
    if isinstance(value, HnswSettings | IvfSettings):
        return value
    return _ADAPTER.validate_python(dict(value or {}))
