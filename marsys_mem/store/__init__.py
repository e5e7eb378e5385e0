"""Storage backends: the :class:`MemoryStore` ABC, in-memory and SQLite stores."""

from marsys_mem.store.base import Key, MemoryStore, validate_key
from marsys_mem.store.memory import InMemoryStore
from marsys_mem.store.sqlite import SQLiteStore

__all__ = ["InMemoryStore", "Key", "MemoryStore", "SQLiteStore", "validate_key"]
