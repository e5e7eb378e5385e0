"""Public test helpers: deterministic fakes and the store conformance suite.

* :func:`fake_summarizer` / :class:`AsyncFakeSummarizer`: summarisers with no model.
* :class:`StoreConformance`: the tests every :class:`~marsys_mem.store.base.MemoryStore`
  backend must pass; subclass it and provide a ``store`` fixture. It needs pytest, so it is
  imported on first use: ``marsys_mem.testing`` itself works without pytest installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from marsys_mem.testing.fakes import AsyncFakeSummarizer, fake_summarizer

if TYPE_CHECKING:
    from marsys_mem.testing.store_conformance import StoreConformance

__all__ = ["AsyncFakeSummarizer", "StoreConformance", "fake_summarizer"]


def __getattr__(name: str) -> Any:
    if name == "StoreConformance":
        from marsys_mem.testing.store_conformance import StoreConformance

        return StoreConformance
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
