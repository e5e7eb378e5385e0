"""Context-manager mixins for objects that own resources and close them.

Every closeable object in marsys-mem (stores, the manager, the memory patterns, the
transports and the coordinator) is also a context manager whose exit calls ``close()``.
These two mixins are that one mechanism, so the classes define only ``close``:

* :class:`Closing`: ``with obj:`` calls ``obj.close()`` on exit (sync).
* :class:`AsyncClosing`: ``async with obj:`` awaits ``obj.close()`` on exit; the class
  defines its own ``__aenter__`` (connecting usually is the interesting part).

Exiting never swallows the exception in flight: ``__exit__`` returns ``None``.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["AsyncClosing", "Closing"]


class Closing:
    """Mixin: a sync context manager that calls ``self.close()`` on exit.

    Example:
        >>> class Resource(Closing):
        ...     closed = False
        ...     def close(self) -> None:
        ...         self.closed = True
        >>> with Resource() as r:
        ...     pass
        >>> r.closed
        True
    """

    def close(self) -> None:
        """Release what the object holds (subclasses override)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncClosing:
    """Mixin: an async context manager whose exit awaits ``self.close()``.

    Example:
        >>> import asyncio
        >>> class Connection(AsyncClosing):
        ...     closed = False
        ...     async def __aenter__(self):
        ...         return self
        ...     async def close(self) -> None:
        ...         self.closed = True
        >>> async def use() -> bool:
        ...     async with Connection() as c:
        ...         pass
        ...     return c.closed
        >>> asyncio.run(use())
        True
    """

    async def close(self) -> None:
        """Release what the object holds (subclasses override)."""
        raise NotImplementedError

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
