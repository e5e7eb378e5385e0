"""Storage backends: the :class:`MemoryStore` ABC, in-memory, SQLite and PostgreSQL stores.

:mod:`marsys_mem.store.retention` holds the one retention rule (ttl / max_messages) every
backend and the manager apply; :mod:`marsys_mem.store.keys` the one store-key scheme.
:class:`~marsys_mem.store.postgres.PostgresStore` needs the ``postgres`` extra, so it
loads on first use (PEP 562 ``__getattr__``): without psycopg, the rest works.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING, Any

from marsys_mem.store.base import Key, MemoryStore, validate_key
from marsys_mem.store.memory import InMemoryStore
from marsys_mem.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from marsys_mem.store.postgres import PostgresStore

__all__ = ["InMemoryStore", "Key", "MemoryStore", "PostgresStore", "SQLiteStore", "validate_key"]


def __getattr__(name: str) -> Any:
    """Load :class:`PostgresStore` (which needs psycopg) on first use."""
    if name == "PostgresStore":
        value = _importlib.import_module("marsys_mem.store.postgres").PostgresStore
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
