"""The store conformance suite, one module per capability of the storage contract.

Every :class:`~marsys_mem.store.base.MemoryStore` backend passes it. A backend's test
module subclasses :class:`StoreConformance` and provides a ``store`` fixture that yields
a fresh, empty store (and closes it afterwards), plus a ``store_factory`` so the
durability and multi-process tests can open the store again, here or in a child
process::

    import pytest
    from marsys_mem.testing import StoreConformance

    class TestMyStore(StoreConformance):
        store_factory = MyStore                 # MyStore(location) opens or creates it

        @pytest.fixture
        def store(self, tmp_path):
            with MyStore(str(tmp_path / "db")) as s:
                yield s

A backend that cannot do an optional capability says so, with the reason; its tests are
then skipped with that reason in the report (``pytest -ra``), never silently::

    class TestMyCache(StoreConformance):
        unsupported = {Capability.DURABILITY: "a cache: nothing outlives the process",
                       Capability.MULTI_PROCESS: "one process's memory"}

Modules (each test's docstring starts with the clause of the contract it checks):

* :mod:`~.harness`: :class:`Capability`, what is required or optional, :class:`StoreHarness`;
* :mod:`~.data`: shared keys, timestamps, messages and snapshots (public);
* :mod:`~.messages`, :mod:`~.deletes`, :mod:`~.keys`, :mod:`~.batches`, :mod:`~.runs`,
  :mod:`~.retention`, :mod:`~.fidelity`, :mod:`~.validation`, :mod:`~.concurrency`,
  :mod:`~.async_twins`, :mod:`~.lifecycle`: the required capabilities;
* :mod:`~.durability`, :mod:`~.processes` (with :mod:`~.writer`, the child process),
  :mod:`~.vectors`, :mod:`~.search`: the optional ones;
* :mod:`~.suite`: :class:`StoreConformance`, all of them in one class.

The async twins run under :func:`asyncio.run`, so the suite needs pytest and nothing
else (no pytest-asyncio mode or marker).
"""

from __future__ import annotations

from marsys_mem.testing.conformance.async_twins import AsyncConformance
from marsys_mem.testing.conformance.batches import BatchesConformance
from marsys_mem.testing.conformance.concurrency import ConcurrencyConformance
from marsys_mem.testing.conformance.data import (
    KEY,
    OTHER_KEY,
    T0,
    THIRD_KEY,
    append_retention_messages,
    message_ids,
    observable_state,
    snapshot_of,
    user_messages,
)
from marsys_mem.testing.conformance.deletes import DeletesConformance
from marsys_mem.testing.conformance.durability import DurabilityConformance
from marsys_mem.testing.conformance.fidelity import FidelityConformance
from marsys_mem.testing.conformance.harness import (
    OPTIONAL_CAPABILITIES,
    REQUIRED_CAPABILITIES,
    UNSUPPORTED_REASON_PREFIX,
    Capability,
    StoreHarness,
)
from marsys_mem.testing.conformance.keys import KeysConformance
from marsys_mem.testing.conformance.lifecycle import LifecycleConformance
from marsys_mem.testing.conformance.messages import MessagesConformance
from marsys_mem.testing.conformance.processes import MultiProcessConformance
from marsys_mem.testing.conformance.retention import RetentionConformance
from marsys_mem.testing.conformance.runs import RunsConformance
from marsys_mem.testing.conformance.search import SearchConformance
from marsys_mem.testing.conformance.suite import CAPABILITY_CLASSES, StoreConformance
from marsys_mem.testing.conformance.validation import ValidationConformance
from marsys_mem.testing.conformance.vectors import VectorsConformance

__all__ = [
    "CAPABILITY_CLASSES",
    "KEY",
    "OPTIONAL_CAPABILITIES",
    "OTHER_KEY",
    "REQUIRED_CAPABILITIES",
    "T0",
    "THIRD_KEY",
    "UNSUPPORTED_REASON_PREFIX",
    "AsyncConformance",
    "BatchesConformance",
    "Capability",
    "ConcurrencyConformance",
    "DeletesConformance",
    "DurabilityConformance",
    "FidelityConformance",
    "KeysConformance",
    "LifecycleConformance",
    "MessagesConformance",
    "MultiProcessConformance",
    "RetentionConformance",
    "RunsConformance",
    "SearchConformance",
    "StoreConformance",
    "StoreHarness",
    "ValidationConformance",
    "VectorsConformance",
    "append_retention_messages",
    "message_ids",
    "observable_state",
    "snapshot_of",
    "user_messages",
]
