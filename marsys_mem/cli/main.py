"""The ``marsys-mem`` console script (also ``python -m marsys_mem``).

``--version`` is answered here, before the commands and the library are imported, so it
takes what starting Python takes; every other command line goes to
:func:`marsys_mem.cli.commands.run_command` (the commands, their parser and the exit
codes are documented there).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from marsys_mem import __version__

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``marsys-mem`` console script; returns the exit code.

    Example:
        >>> main(["--version"])
        marsys-mem 0.1.0
        0
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:
        print(f"marsys-mem {__version__}")
        return 0
    from marsys_mem.cli.commands import run_command  # noqa: PLC0415 (the heavy part)

    return run_command(args)


if __name__ == "__main__":
    raise SystemExit(main())
