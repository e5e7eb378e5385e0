"""Both backends against the public conformance suite (marsys_mem.testing)."""

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from marsys_mem.store import InMemoryStore, MemoryStore, SQLiteStore
from marsys_mem.testing import Capability, StoreConformance
from marsys_mem.testing.conformance import (
    CAPABILITY_CLASSES,
    OPTIONAL_CAPABILITIES,
    REQUIRED_CAPABILITIES,
    UNSUPPORTED_REASON_PREFIX,
    StoreHarness,
)
from marsys_mem.testing.conformance.harness import factory_reference


class TestInMemoryStore(StoreConformance):
    """InMemoryStore: every required capability; it lives in one process's memory."""

    unsupported: ClassVar[Mapping[Capability, str]] = {
        Capability.DURABILITY: "InMemoryStore keeps its data in the process's memory",
        Capability.MULTI_PROCESS: "InMemoryStore cannot be opened from another process",
        Capability.SEARCH: "InMemoryStore's readers search on the host (RAGMemory's indexes)",
    }

    @pytest.fixture
    def store(self) -> Iterator[MemoryStore]:
        backend = InMemoryStore()
        yield backend
        backend.close()


class TestSQLiteStore(StoreConformance):
    """SQLiteStore: every capability but search, durability and several processes included."""

    store_factory = SQLiteStore
    unsupported: ClassVar[Mapping[Capability, str]] = {
        Capability.SEARCH: "SQLiteStore's readers search on the host (per-host faiss + BM25)",
    }

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[MemoryStore]:
        backend = SQLiteStore(tmp_path / "store.db")
        yield backend
        backend.close()


# ---------------------------------------------------------------------- the harness itself
def test_every_test_is_in_one_capability_module_with_its_clause() -> None:
    """Each capability's tests live in its own class and module, each with a docstring."""
    assert set(CAPABILITY_CLASSES) == set(Capability)
    assert REQUIRED_CAPABILITIES | OPTIONAL_CAPABILITIES == set(Capability)
    assert not REQUIRED_CAPABILITIES & OPTIONAL_CAPABILITIES
    owner: dict[str, Capability] = {}
    for capability, cls in CAPABILITY_CLASSES.items():
        assert cls.__module__.startswith("marsys_mem.testing.conformance.")
        names = [n for n in vars(cls) if n.startswith("test_")]
        assert names, capability
        for name in names:
            assert name not in owner, f"{name} in {owner[name]} and {capability}"
            owner[name] = capability
            doc = getattr(cls, name).__doc__ or ""
            summary, _, body = doc.partition("\n\n")
            assert summary.strip(), f"{cls.__name__}.{name}"
            assert "Checks:" in body, f"{cls.__name__}.{name}"
    suite = {n for n in dir(StoreConformance) if n.startswith("test_")}
    assert suite == set(owner)
    assert len(suite) >= 51  # the suite before the split had 51 test methods


def test_capability_report_defaults_to_required() -> None:
    assert set(StoreConformance.capability_report().values()) == {"required"}
    report = TestInMemoryStore.capability_report()
    assert report[Capability.DURABILITY].startswith("unsupported: InMemoryStore keeps")
    assert report[Capability.MESSAGES] == "required"


@pytest.mark.parametrize(
    ("unsupported", "error"),
    [
        ({Capability.RETENTION: "too hard"}, "'retention', which every backend must support"),
        ({Capability.DURABILITY: "  "}, "needs a reason"),
        ({"nonsense": "why"}, "nonsense"),
    ],
)
def test_only_optional_capabilities_may_be_declared_unsupported(
    unsupported: dict[Any, str], error: str
) -> None:
    class Bad(StoreHarness):
        pass

    Bad.unsupported = unsupported
    with pytest.raises(ValueError, match=error):
        Bad.capability_report()


def test_an_unsupported_capability_skips_with_its_reason() -> None:
    harness = TestInMemoryStore()
    with pytest.raises(pytest.skip.Exception) as skipped:
        harness.require(Capability.MULTI_PROCESS)
    reason = str(skipped.value)
    assert reason.startswith(f"{UNSUPPORTED_REASON_PREFIX} 'multi_process' (TestInMemoryStore)")
    assert reason.endswith("InMemoryStore cannot be opened from another process")
    harness.require(Capability.MESSAGES)  # required: runs


def test_a_required_capability_without_a_factory_fails_saying_what_to_do() -> None:
    class NoFactory(StoreHarness):
        pass

    harness = NoFactory()
    harness.require(Capability.DURABILITY)  # required by default: not skipped
    with pytest.raises(pytest.fail.Exception, match="sets no store_factory"):
        harness.open_store("anywhere")


def test_the_factory_must_be_importable_by_name() -> None:
    assert factory_reference(SQLiteStore) == "marsys_mem.store.sqlite:SQLiteStore"
    with pytest.raises(ValueError, match="cannot be imported by name"):
        factory_reference(lambda location: SQLiteStore(location))
