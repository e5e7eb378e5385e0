"""How a store that searches in the database builds and walks its vector index (HNSW).

One frozen model, :class:`HnswSettings`: the constructor argument of
:class:`~marsys_mem.store.postgres.PostgresStore` and the ``store.vector_index`` section of
a config file. See the guide ``docs/guides/several-hosts.md`` for how to choose.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["HnswSettings"]


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
