"""The exception tree drawn in ``marsys_mem.exceptions``' docstring is the real one.

The drawing is parsed (each name, its depth, the builtins in parentheses) and checked
against the classes: every error is drawn, under its real parent, with its real builtin
bases; and every error the library defines lives in ``marsys_mem.exceptions``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass

import pytest

import marsys_mem
from marsys_mem import coordination, exceptions
from marsys_mem.coordination import signing, transport
from marsys_mem.exceptions import MarsysMemError

_LINE = re.compile(
    r"^    (?P<indent>(?:[│ ]   )*)(?P<branch>[├└]── )?(?P<name>[A-Z]\w*)"
    r"(?: \((?P<bases>[\w, ]+)\))?(?:\s{2,}\S.*)?$"
)


@dataclass(frozen=True)
class Drawn:
    name: str
    parent: str | None
    builtins: tuple[str, ...]
    last: bool  # drawn with '└──'


def parse_tree(doc: str) -> list[Drawn]:
    """The tree in the first literal block (after ``::``) of ``doc``."""
    lines = doc.split("::\n", 1)[1].splitlines()
    block: list[str] = []
    for line in lines:
        if not line.strip():
            if block:
                break
            continue
        if not line.startswith("    "):
            break
        block.append(line)
    stack: list[str] = []  # the names on the path to the current line
    drawn: list[Drawn] = []
    for line in block:
        m = _LINE.match(line)
        assert m is not None, f"cannot parse tree line {line!r}"
        depth = len(m["indent"]) // 4 + (1 if m["branch"] else 0)
        assert depth <= len(stack), f"{line!r} is indented below no parent"
        del stack[depth:]
        bases = tuple(b.strip() for b in m["bases"].split(",")) if m["bases"] else ()
        parent = stack[-1] if stack else None
        drawn.append(Drawn(m["name"], parent, bases, (m["branch"] or "").startswith("└")))
        stack.append(m["name"])
    return drawn


def library_errors() -> set[type[MarsysMemError]]:
    """Every subclass of MarsysMemError defined by the library, after importing all of it."""
    for info in pkgutil.walk_packages(marsys_mem.__path__, "marsys_mem."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            continue
    found: set[type[MarsysMemError]] = set()
    todo: list[type[MarsysMemError]] = [MarsysMemError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("marsys_mem") and cls not in found:
            found.add(cls)
            todo.extend(cls.__subclasses__())
    return found


@pytest.fixture(scope="module")
def drawn() -> list[Drawn]:
    assert exceptions.__doc__ is not None
    return parse_tree(exceptions.__doc__)


def test_the_parser_reads_a_small_tree() -> None:
    doc = """x::

    Root
    ├── A (ValueError)          text
    │   └── B                   more text
    └── C (KeyError, OSError)   end

after
"""
    assert parse_tree(doc) == [
        Drawn("Root", None, (), False),
        Drawn("A", "Root", ("ValueError",), False),
        Drawn("B", "A", (), True),
        Drawn("C", "Root", ("KeyError", "OSError"), True),
    ]


def test_the_tree_has_one_root_and_no_name_twice(drawn: list[Drawn]) -> None:
    names = [d.name for d in drawn]
    assert len(names) == len(set(names)), "a class is drawn twice"
    assert [d.name for d in drawn if d.parent is None] == ["MarsysMemError"]
    assert len(drawn) >= 25


def test_every_error_is_drawn(drawn: list[Drawn]) -> None:
    names = {d.name for d in drawn}
    exported = {
        n
        for n in exceptions.__all__
        if isinstance(getattr(exceptions, n), type)
        and issubclass(getattr(exceptions, n), MarsysMemError)
    }
    assert exported - names == set(), "errors missing from the drawn tree"
    defined = {cls.__name__ for cls in library_errors()}
    assert defined - names == set(), "library errors missing from the drawn tree"


def test_every_error_lives_in_exceptions() -> None:
    elsewhere = {
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in library_errors()
        if cls.__module__ != "marsys_mem.exceptions"
    }
    assert elsewhere == set(), "one hierarchy: define errors in marsys_mem.exceptions"


def test_every_drawn_class_exists_under_its_drawn_parent(drawn: list[Drawn]) -> None:
    for d in drawn:
        cls = getattr(exceptions, d.name, None)
        assert isinstance(cls, type), f"{d.name} is drawn but not defined"
        assert issubclass(cls, MarsysMemError)
        assert d.name in exceptions.__all__
        if d.parent is None:
            continue
        ours = [b.__name__ for b in cls.__bases__ if issubclass(b, MarsysMemError)]
        assert ours == [d.parent], f"{d.name} is drawn under {d.parent}, its bases are {ours}"


def test_the_builtins_in_parentheses_are_the_other_bases(drawn: list[Drawn]) -> None:
    for d in drawn:
        cls = getattr(exceptions, d.name)
        others = tuple(b.__name__ for b in cls.__bases__ if not issubclass(b, MarsysMemError))
        if d.parent is None:
            assert others == ("Exception",)
            continue
        assert others == d.builtins, f"{d.name}: drawn {d.builtins}, bases {others}"


def test_the_last_child_is_drawn_with_the_corner(drawn: list[Drawn]) -> None:
    children: dict[str | None, list[Drawn]] = {}
    for d in drawn:
        children.setdefault(d.parent, []).append(d)
    for parent, kids in children.items():
        if parent is None:
            continue
        assert [k.last for k in kids] == [False] * (len(kids) - 1) + [True], parent


def test_coordination_errors_live_in_exceptions_only() -> None:
    for name in (
        "AuthenticationError",
        "BranchError",
        "CoordinationError",
        "MergeCycleError",
        "SignatureError",
        "TransportError",
        "UnknownBranchError",
    ):
        assert name in exceptions.__all__
        for module in (transport, coordination, signing):  # no re-exports: one home
            assert name not in module.__all__, (module.__name__, name)
    assert issubclass(exceptions.SignatureError, exceptions.CoordinationError)
