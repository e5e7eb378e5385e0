"""The whole conformance suite: every capability's tests in one class.

A backend's test module subclasses :class:`StoreConformance` and provides a ``store``
fixture (a fresh, empty store, closed afterwards), a ``store_factory``, and, for the
optional capabilities it lacks, ``unsupported`` with the reasons (see
:class:`~marsys_mem.testing.conformance.harness.StoreHarness`, and
:mod:`marsys_mem.testing.conformance` for an example).
"""

from __future__ import annotations

from marsys_mem.testing.conformance.async_twins import AsyncConformance
from marsys_mem.testing.conformance.batches import BatchesConformance
from marsys_mem.testing.conformance.concurrency import ConcurrencyConformance
from marsys_mem.testing.conformance.deletes import DeletesConformance
from marsys_mem.testing.conformance.durability import DurabilityConformance
from marsys_mem.testing.conformance.fidelity import FidelityConformance
from marsys_mem.testing.conformance.harness import Capability, StoreHarness
from marsys_mem.testing.conformance.keys import KeysConformance
from marsys_mem.testing.conformance.lifecycle import LifecycleConformance
from marsys_mem.testing.conformance.messages import MessagesConformance
from marsys_mem.testing.conformance.owners import OwnersConformance
from marsys_mem.testing.conformance.processes import MultiProcessConformance
from marsys_mem.testing.conformance.retention import RetentionConformance
from marsys_mem.testing.conformance.runs import RunsConformance
from marsys_mem.testing.conformance.search import SearchConformance
from marsys_mem.testing.conformance.validation import ValidationConformance
from marsys_mem.testing.conformance.vectors import VectorsConformance

__all__ = ["CAPABILITY_CLASSES", "StoreConformance"]

CAPABILITY_CLASSES: dict[Capability, type[StoreHarness]] = {
    Capability.MESSAGES: MessagesConformance,
    Capability.DELETES: DeletesConformance,
    Capability.KEYS: KeysConformance,
    Capability.BATCHES: BatchesConformance,
    Capability.RUNS: RunsConformance,
    Capability.RETENTION: RetentionConformance,
    Capability.FIDELITY: FidelityConformance,
    Capability.VALIDATION: ValidationConformance,
    Capability.CONCURRENCY: ConcurrencyConformance,
    Capability.ASYNC: AsyncConformance,
    Capability.LIFECYCLE: LifecycleConformance,
    Capability.DURABILITY: DurabilityConformance,
    Capability.MULTI_PROCESS: MultiProcessConformance,
    Capability.VECTORS: VectorsConformance,
    Capability.OWNERS: OwnersConformance,
    Capability.SEARCH: SearchConformance,
}
"""The class holding each capability's tests (one module each)."""


class StoreConformance(
    MessagesConformance,
    DeletesConformance,
    KeysConformance,
    BatchesConformance,
    RunsConformance,
    RetentionConformance,
    FidelityConformance,
    ValidationConformance,
    ConcurrencyConformance,
    AsyncConformance,
    LifecycleConformance,
    DurabilityConformance,
    MultiProcessConformance,
    VectorsConformance,
    OwnersConformance,
    SearchConformance,
):
    """Tests every :class:`~marsys_mem.store.base.MemoryStore` backend must pass.

    One base class per :class:`~marsys_mem.testing.conformance.harness.Capability`
    (see :data:`CAPABILITY_CLASSES`); each test's docstring starts with the clause of
    the contract it checks. Durability and multi-process tests open the store again
    with ``store_factory``; a backend that lacks one of those capabilities declares it in
    ``unsupported`` with the reason, and those tests are skipped with it.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestInMemory(StoreConformance):
        ...     unsupported = {
        ...         Capability.DURABILITY: "lives in the process's memory",
        ...         Capability.MULTI_PROCESS: "lives in one process's memory",
        ...     }
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
        >>> TestInMemory.capability_report()[Capability.RETENTION]
        'required'
    """
