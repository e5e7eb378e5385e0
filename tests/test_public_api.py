import importlib

import marsys_mem


def test_all_is_sorted_and_complete():
    names = marsys_mem.__all__

    # isort-style order (ruff RUF022): CONSTANTS, then Classes, then functions
    def key(n: str) -> tuple[int, str]:
        return (0 if n.isupper() else 1 if n[:1].isupper() else 2, n)

    assert list(names) == sorted(names, key=key)
    public = {n for n in vars(marsys_mem) if not n.startswith("_")} - {
        "annotations",
    }
    modules = {n for n in public if type(getattr(marsys_mem, n)).__name__ == "module"}
    assert set(names) | {"__version__"} >= public - modules
    for name in names:
        assert hasattr(marsys_mem, name), name


def test_every_module_has_explicit_all():
    for mod in [
        "context",
        "conversation",
        "events",
        "exceptions",
        "messages",
        "summarize",
        "tokens",
        "patterns",
        "coordination",
        "embeddings",
        "index",
        "facts",
        "compose",
        "manager",
        "retention",
        "runs",
        "store",
    ]:
        module = importlib.import_module(f"marsys_mem.{mod}")
        assert isinstance(module.__all__, list)
        for name in module.__all__:
            assert hasattr(module, name), f"{mod}.{name}"


def test_symlinked_subpackages_install_under_marsys_mem():
    import marsys_mem.coordination as coordination
    import marsys_mem.patterns as patterns

    assert patterns.__name__ == "marsys_mem.patterns"
    assert coordination.__name__ == "marsys_mem.coordination"
