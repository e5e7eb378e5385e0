"""Former home of the store conformance suite, kept so older imports keep working.

The suite now lives in :mod:`marsys_mem.testing.conformance`, one module per capability;
import :class:`StoreConformance` from :mod:`marsys_mem.testing` and the shared data from
:mod:`marsys_mem.testing.conformance.data`.
"""

from __future__ import annotations

from marsys_mem.testing.conformance.data import KEY, OTHER_KEY, T0, snapshot_of, user_messages
from marsys_mem.testing.conformance.suite import StoreConformance

__all__ = ["KEY", "OTHER_KEY", "T0", "StoreConformance", "snapshot_of", "user_messages"]
