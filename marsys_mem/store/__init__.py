"""Storage backends: the :class:`MemoryStore` ABC, in-memory and SQLite stores.

:mod:`marsys_mem.store.retention` holds the one retention rule (ttl / max_messages) every
backend and the manager apply; :mod:`marsys_mem.store.keys` the one store-key scheme.
"""

from marsys_mem.store.base import Key, MemoryStore, validate_key
from marsys_mem.store.memory import InMemoryStore
from marsys_mem.store.sqlite import SQLiteStore

__all__ = ["InMemoryStore", "Key", "MemoryStore", "SQLiteStore", "validate_key"]
