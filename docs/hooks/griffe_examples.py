"""Griffe extension: read the project's ``Example:`` sections as doctest examples.

The project writes Google-style ``Example:`` (singular, as ruff's pydocstyle and the design
require); griffe only knows ``Examples:`` and would render the section's ``>>>`` lines as
Markdown. Renaming the section title before the docstring is parsed keeps them code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExamplesSection(griffe.Extension):
    """Rename ``Example:`` to ``Examples:`` in every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite the docstring of each object as it is loaded."""
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
