"""The manager layer: :class:`MemoryManager` (the composition root) and its sinks.

:mod:`marsys_mem.manager.memory_manager` holds the manager; :mod:`marsys_mem.manager.sinks`
the one-way write path from an agent's memory to the store, its patterns and its bound.
"""

from marsys_mem.manager.memory_manager import MemoryManager

__all__ = ["MemoryManager"]
