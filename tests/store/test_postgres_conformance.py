"""PostgresStore against the public conformance suite, on the servers the tests start.

Twice: on the machine's PostgreSQL without pgvector (the fallback: hosts search), and on
PostgreSQL with pgvector (search inside the database, the search capability included).
"""

from collections.abc import Iterator, Mapping
from typing import ClassVar

import pytest

from marsys_mem.store import MemoryStore
from marsys_mem.store.postgres import PostgresStore
from marsys_mem.testing import StoreConformance
from marsys_mem.testing.conformance import Capability


class TestPostgresStore(StoreConformance):
    """PostgresStore without pgvector: every capability but search (its hosts search)."""

    store_factory = PostgresStore
    unsupported: ClassVar[Mapping[Capability, str]] = {
        Capability.SEARCH: "no vector extension in this database: hosts search (the fallback)",
    }

    @pytest.fixture
    def store(self, postgres_dsn: str) -> Iterator[MemoryStore]:
        backend = PostgresStore(postgres_dsn, max_size=4)
        yield backend
        backend.close()

    @pytest.fixture
    def store_location(self, postgres_dsn: str) -> str:
        return postgres_dsn


class TestPostgresStorePgvector(StoreConformance):
    """PostgresStore with pgvector: every capability, search in the database included."""

    store_factory = PostgresStore

    @pytest.fixture
    def store(self, pgvector_dsn: str) -> Iterator[MemoryStore]:
        backend = PostgresStore(pgvector_dsn, max_size=4)
        yield backend
        backend.close()

    @pytest.fixture
    def store_location(self, pgvector_dsn: str) -> str:
        return pgvector_dsn


class TestPostgresStoreIvfflat(StoreConformance):
    """PostgresStore with pgvector and IVFFlat settings: no index until one is built, so
    every search scans exactly (tests/store/test_postgres_ivf.py searches the lists)."""

    store_factory = PostgresStore

    @pytest.fixture
    def store(self, pgvector_dsn: str) -> Iterator[MemoryStore]:
        backend = PostgresStore(pgvector_dsn, max_size=4, vector_index={"kind": "ivfflat"})
        yield backend
        backend.close()

    @pytest.fixture
    def store_location(self, pgvector_dsn: str) -> str:
        return pgvector_dsn
