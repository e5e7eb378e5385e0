"""Griffe extension: read the project's reST-flavoured Google docstrings as the site shows them.

The project writes Google-style ``Example:`` (singular, as ruff's pydocstyle and the design
require); griffe only knows ``Examples:`` and would render the section's ``>>>`` lines as
Markdown, so the section title is renamed before the docstring is parsed. Sphinx roles
(``:class:`~marsys_mem.store.SQLiteStore```) become code spans (``SQLiteStore``), as the
guides write them.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    if match.group(1) == "~":
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def _plain(text: str) -> str:
    """``text`` with Sphinx roles as code spans, except in ``Raises:`` sections.

    There griffe reads each entry as ``exception: description`` and a role's colons are
    what it splits on, so those lines are left as written.
    """
    out: list[str] = []
    raises_indent: int | None = None
    for line in text.splitlines(keepends=True):
        indent = len(line) - len(line.lstrip())
        if raises_indent is not None and line.strip() and indent <= raises_indent:
            raises_indent = None
        if line.strip() == "Raises:":
            raises_indent = indent
        out.append(line if raises_indent is not None else _ROLE.sub(_role, line))
    return "".join(out)


class ExamplesSection(griffe.Extension):
    """Rename ``Example:`` to ``Examples:`` and turn Sphinx roles into code spans."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite the docstring of each object as it is loaded."""
        if obj.docstring is not None:
            text = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = _plain(text)
