"""PostgresStore against the public conformance suite, on a server the tests start."""

from collections.abc import Iterator

import pytest

from marsys_mem.store import MemoryStore
from marsys_mem.store.postgres import PostgresStore
from marsys_mem.testing import StoreConformance


class TestPostgresStore(StoreConformance):
    """PostgresStore: every capability, durability and several processes included."""

    store_factory = PostgresStore

    @pytest.fixture
    def store(self, postgres_dsn: str) -> Iterator[MemoryStore]:
        backend = PostgresStore(postgres_dsn, max_size=4)
        yield backend
        backend.close()

    @pytest.fixture
    def store_location(self, postgres_dsn: str) -> str:
        return postgres_dsn
