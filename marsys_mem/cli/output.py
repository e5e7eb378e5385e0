"""What the command line prints: plain text or rich, tables, progress and spinners.

Output is coloured on a terminal (unless ``NO_COLOR`` is set) and plain otherwise;
progress bars and spinners go to stderr, on a terminal only, so piped output stays clean.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

__all__ = ["Output", "isatty", "progress_bar", "safe_text", "status_spinner"]

# C0 controls but tab and newline, DEL, C1 controls (ESC sequences: title, clear, colour,
# OSC 8 links), and the invisible / bidi format characters that reorder or hide text
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u2064\u2066-\u2069\ufeff]"
)


def safe_text(text: str) -> str:
    r"""``text`` with every terminal control and bidi character shown as an escape.

    Stored text (messages, facts, names of another era) reaches the terminal through the
    CLI's human-readable output; an escape sequence in it must not set the title, clear
    the screen or reorder the line. Tabs and newlines stay.

    Example:
        >>> print(safe_text("invoice \x1b]0;PWNED\x07\x1b[2J total"))
        invoice \x1b]0;PWNED\x07\x1b[2J total
        >>> print(safe_text("evil\u202etxt.exe"))
        evil\u202etxt.exe
    """
    return _UNSAFE.sub(lambda m: _escape(m.group()), text)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def isatty(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (false for closed or odd streams).

    Example:
        >>> import io
        >>> isatty(io.StringIO())
        False
    """
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Output:
    """stdout of a command: rich on a terminal (unless ``NO_COLOR``), plain text otherwise.

    Example:
        >>> import io
        >>> out = Output(io.StringIO())
        >>> out.table(["agent", "messages"], [["planner", 3]])
        >>> print(out.stream.getvalue().rstrip())
        agent    messages
        planner  3
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.console: Console | None = None
        if isatty(stream) and "NO_COLOR" not in os.environ:
            self.console = Console(file=stream, highlight=False, soft_wrap=True)

    def print(self, text: str = "", style: str | None = None) -> None:
        """One line, in ``style`` (a rich style) on a terminal; controls shown escaped."""
        text = safe_text(text)
        if self.console is None:
            print(text, file=self.stream)
            return
        self.console.print(Text(text, style=style or ""))

    def report(self, text: str) -> None:
        """A report: ``==`` headers bold, ✓ green, ✗ and FAILED red."""
        for line in text.splitlines():
            style = None
            if line.startswith("=="):
                style = "bold cyan"
            elif line.startswith("FAILED") or "✗" in line:
                style = "bold red"
            elif line == "ok" or ("✓" in line and "✗" not in line):
                style = "green"
            self.print(line, style)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        """Columns padded to their widest cell, the header bold."""
        cells = [[str(c) for c in row] for row in rows]
        widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
        head = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
        self.print(head.rstrip(), "bold")
        for row in cells:
            self.print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


@contextlib.contextmanager
def progress_bar(title: str, enabled: bool) -> Iterator[Callable[[int, int, str], None] | None]:
    """A progress bar on stderr (terminal only); yields the workflow progress callback.

    Yields ``None`` (no bar) when not ``enabled`` or stderr is not a terminal.
    """
    if not enabled or not isatty(sys.stderr):
        yield None
        return
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(title, total=None)

        def update(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=f"{title}: {label}")

        yield update


@contextlib.contextmanager
def status_spinner(text: str) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr (terminal only) for slow work without steps.

    Yields ``update(text)``, which changes the spinner's text.
    """
    if not isatty(sys.stderr):
        yield lambda _text: None
        return
    with Console(stderr=True).status(text) as status:
        yield lambda new: status.update(new)
