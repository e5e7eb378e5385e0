"""What the conformance suite needs from a backend: a store, and its optional capabilities.

Every :class:`~marsys_mem.store.base.MemoryStore` backend must pass the *required*
capabilities. Four are *optional*, because a correct backend may lack them by design (an
in-process store cannot outlive its process):

* :attr:`Capability.DURABILITY`: what a store wrote is there when the store is opened
  again, after a ``close`` or after the writing process exited without one.
* :attr:`Capability.MULTI_PROCESS`: several processes share one store at once.
* :attr:`Capability.VECTORS`: embeddings stored next to their messages, read back by
  cursor (:attr:`~marsys_mem.store.base.MemoryStore.supports_vectors`).
* :attr:`Capability.SEARCH`: dense and keyword search inside the store
  (:attr:`~marsys_mem.store.base.MemoryStore.supports_search`).

Optional does not mean assumed: by default every capability is required, and a backend
that lacks one says so, with a reason, in :attr:`StoreHarness.unsupported`. Its tests are
then skipped with that reason in the pytest report (``-ra`` prints it), never silently.
A required capability whose tests cannot run (no :attr:`StoreHarness.store_factory` to
open a second store with) fails with a message saying what to provide.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import ClassVar, Protocol

import pytest

from marsys_mem.store.base import MemoryStore

__all__ = [
    "OPTIONAL_CAPABILITIES",
    "REQUIRED_CAPABILITIES",
    "UNSUPPORTED_REASON_PREFIX",
    "Capability",
    "StoreFactory",
    "StoreHarness",
    "factory_reference",
    "load_factory",
]


class Capability(StrEnum):
    """A part of the :class:`~marsys_mem.store.base.MemoryStore` contract, one module each.

    Example:
        >>> Capability("durability") is Capability.DURABILITY
        True
        >>> Capability.DURABILITY in OPTIONAL_CAPABILITIES
        True
    """

    MESSAGES = "messages"
    """Append and load: order, ``since``, ``last``, unique ids per key."""
    DELETES = "deletes"
    """Delete by ids and/or ``before``, and counts."""
    KEYS = "keys"
    """Listing keys, their order and their isolation."""
    BATCHES = "batches"
    """``batch``: one transaction, all or nothing, one result per op."""
    RUNS = "runs"
    """Run snapshots: save, replace, load, list."""
    RETENTION = "retention"
    """``enforce_retention``: ttl, then ``max_messages``, protected messages last."""
    FIDELITY = "fidelity"
    """Every field and every timestamp comes back equal."""
    VALIDATION = "validation"
    """Malformed keys and arguments are rejected before anything is written."""
    CONCURRENCY = "concurrency"
    """Threads sharing one store instance."""
    ASYNC = "async"
    """The ``a``-prefixed twins."""
    LIFECYCLE = "lifecycle"
    """``close`` and ``with store:``."""
    DURABILITY = "durability"
    """Data outlives the store object and the process that wrote it (optional)."""
    MULTI_PROCESS = "multi_process"
    """Several processes write one store at once (optional)."""
    OWNERS = "owners"
    """Derived records deleted with their last source; the deletion log."""
    VECTORS = "vectors"
    """Vectors stored by message and model, cursors, deleted with messages (optional)."""
    SEARCH = "search"
    """Dense and keyword search inside the store, filtered, never finding the deleted
    (optional)."""


OPTIONAL_CAPABILITIES: frozenset[Capability] = frozenset(
    {Capability.DURABILITY, Capability.MULTI_PROCESS, Capability.VECTORS, Capability.SEARCH}
)
"""Capabilities a backend may declare unsupported (with a reason)."""

REQUIRED_CAPABILITIES: frozenset[Capability] = frozenset(Capability) - OPTIONAL_CAPABILITIES
"""Capabilities every backend must pass; they cannot be declared unsupported."""

UNSUPPORTED_REASON_PREFIX = "unsupported capability"
"""How the skip reason of a declared-unsupported capability starts, in the pytest report."""


class StoreFactory(Protocol):
    """Opens (creating if needed) the store at a location: a backend class, or a function.

    Example:
        >>> from marsys_mem.store import SQLiteStore
        >>> factory: StoreFactory = SQLiteStore
    """

    def __call__(self, location: str, /) -> MemoryStore:
        """Open the store at ``location``."""
        ...


def factory_reference(factory: StoreFactory) -> str:
    """``"module:qualname"`` of ``factory``, the form a child process imports it by.

    Args:
        factory: a class or a module-level function.

    Returns:
        The reference.

    Raises:
        ValueError: ``factory`` cannot be imported by name (a lambda, a local function).

    Example:
        >>> from marsys_mem.store import SQLiteStore
        >>> factory_reference(SQLiteStore)
        'marsys_mem.store.sqlite:SQLiteStore'
    """
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise ValueError(
            f"store_factory {factory!r} cannot be imported by name: use a class or a "
            "module-level function"
        )
    return f"{module}:{qualname}"


def load_factory(reference: str) -> StoreFactory:
    """Import the factory that :func:`factory_reference` named.

    Args:
        reference: ``"module:qualname"``.

    Returns:
        The factory.

    Example:
        >>> load_factory("marsys_mem.store.sqlite:SQLiteStore").__name__
        'SQLiteStore'
    """
    module_name, _, qualname = reference.partition(":")
    target: object = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{reference} is not callable")
    factory: StoreFactory = target
    return factory


class StoreHarness:
    """The base of every conformance class: how a backend's test class plugs in.

    A backend's test class provides:

    * a ``store`` fixture: a fresh, empty store, closed afterwards (every test uses it);
    * :attr:`store_factory`: opens (creating if needed) the store at a location, so the
      durability and multi-process tests can open it again, in this process or another;
    * :attr:`unsupported`: the optional capabilities it lacks, each with the reason;
    * optionally a ``store_location`` fixture, if a location is not a file path.

    Example:
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestInMemory(StoreHarness):
        ...     unsupported = {Capability.DURABILITY: "lives in the process's memory"}
        >>> TestInMemory.capability_report()[Capability.DURABILITY]
        "unsupported: lives in the process's memory"
        >>> TestInMemory.capability_report()[Capability.MESSAGES]
        'required'
    """

    store_factory: ClassVar[StoreFactory | None] = None
    """A class or module-level function ``location -> MemoryStore``; child processes
    import it by its module and qualified name. ``None``: the backend cannot be opened
    again, so :attr:`Capability.DURABILITY` and :attr:`Capability.MULTI_PROCESS` fail
    unless declared in :attr:`unsupported`."""

    unsupported: ClassVar[Mapping[Capability, str]] = {}
    """Optional capabilities this backend lacks, each mapped to the reason (non-empty)."""

    @classmethod
    def capability_report(cls) -> dict[Capability, str]:
        """Every capability with ``"required"`` or ``"unsupported: <reason>"``.

        Returns:
            The report, in :class:`Capability` order.

        Raises:
            ValueError: :attr:`unsupported` names a required capability, or gives no reason.
        """
        for capability, reason in cls.unsupported.items():
            capability = Capability(capability)
            if capability in REQUIRED_CAPABILITIES:
                raise ValueError(
                    f"{cls.__name__}.unsupported names {capability.value!r}, which every "
                    "backend must support; only "
                    f"{sorted(c.value for c in OPTIONAL_CAPABILITIES)} are optional"
                )
            if not isinstance(reason, str) or not reason.strip():
                raise ValueError(f"{cls.__name__}.unsupported[{capability.value!r}] needs a reason")
        declared = {Capability(c): r for c, r in cls.unsupported.items()}
        return {
            c: f"unsupported: {declared[c]}" if c in declared else "required" for c in Capability
        }

    def require(self, capability: Capability) -> None:
        """Skip the calling test, with the declared reason, if ``capability`` is unsupported.

        Args:
            capability: the capability the test checks.

        Raises:
            ValueError: the declaration is invalid (see :meth:`capability_report`).
        """
        status = self.capability_report()[capability]
        if status != "required":
            pytest.skip(
                f"{UNSUPPORTED_REASON_PREFIX} {capability.value!r} "
                f"({type(self).__name__}): {status.removeprefix('unsupported: ')}"
            )

    def open_store(self, location: str) -> MemoryStore:
        """Open the store at ``location`` with :attr:`store_factory`.

        Args:
            location: where the store lives (see the ``store_location`` fixture).

        Returns:
            A store; the caller closes it.
        """
        return load_factory(self.factory_reference())(location)

    def factory_reference(self) -> str:
        """``"module:qualname"`` of :attr:`store_factory`, for a child process.

        Returns:
            The reference.

        Raises:
            pytest.fail.Exception: no :attr:`store_factory` is set; the message says
                to set one or to declare the capability unsupported.
        """
        factory = type(self).store_factory
        if factory is None:
            pytest.fail(
                f"{type(self).__name__} sets no store_factory, so its store cannot be opened "
                "again: set store_factory (a class or module-level function location -> "
                "store), or declare the capabilities it lacks in `unsupported` with a reason"
            )
        return factory_reference(factory)

    @pytest.fixture
    def store_location(self, tmp_path: Path) -> str:
        """Where the durability and multi-process tests open their store: a fresh path."""
        return str(tmp_path / "conformance-store")
