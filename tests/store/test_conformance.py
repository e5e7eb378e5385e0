"""Both backends against the public conformance suite (marsys_mem.testing)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from marsys_mem.store import InMemoryStore, MemoryStore, SQLiteStore
from marsys_mem.testing import StoreConformance


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MemoryStore]:
    backend: MemoryStore = (
        InMemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "store.db")
    )
    yield backend
    backend.close()


class TestStoreConformance(StoreConformance):
    """Runs every conformance test on each backend."""
