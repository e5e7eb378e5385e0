"""Public test helpers: deterministic fakes and the store conformance suite.

* :func:`fake_summarizer` / :class:`AsyncFakeSummarizer`: summarisers with no model.
* :class:`StoreConformance`: the tests every :class:`~marsys_mem.store.base.MemoryStore`
  backend must pass, one module per :class:`Capability` in
  :mod:`marsys_mem.testing.conformance`; subclass it and provide a ``store`` fixture.
  It needs pytest, so it loads on first use (PEP 562 ``__getattr__``):
  ``marsys_mem.testing`` itself works without pytest installed.
* :mod:`marsys_mem.testing.postgres`: :class:`~marsys_mem.testing.postgres.PostgresServer`,
  a throwaway PostgreSQL (initdb + pg_ctl on a free loopback port, in a temp folder; as an
  unprivileged account under root) that can be restarted or crashed, for tests of
  :class:`~marsys_mem.store.postgres.PostgresStore` and of several hosts sharing one.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING, Any

from marsys_mem.testing.fakes import AsyncFakeSummarizer, fake_summarizer

if TYPE_CHECKING:
    from marsys_mem.testing.conformance import Capability, StoreConformance

__all__ = ["AsyncFakeSummarizer", "Capability", "StoreConformance", "fake_summarizer"]

_NEEDS_PYTEST = frozenset({"Capability", "StoreConformance"})


def __getattr__(name: str) -> Any:
    """Load the conformance names (which need pytest) on first use."""
    if name in _NEEDS_PYTEST:
        value = getattr(_importlib.import_module("marsys_mem.testing.conformance"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
