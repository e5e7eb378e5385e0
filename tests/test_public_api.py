import importlib
import pkgutil
import subprocess
import sys

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
    modules = [
        info.name
        for info in pkgutil.walk_packages(marsys_mem.__path__, "marsys_mem.")
        if info.name != "marsys_mem.__main__"
    ]
    assert len(modules) > 50
    for name in modules:
        module = importlib.import_module(name)
        assert isinstance(getattr(module, "__all__", None), list), name
        for export in module.__all__:
            assert hasattr(module, export), f"{name}.{export}"


def test_symlinked_subpackages_install_under_marsys_mem():
    import marsys_mem.coordination as coordination
    import marsys_mem.patterns as patterns

    assert patterns.__name__ == "marsys_mem.patterns"
    assert coordination.__name__ == "marsys_mem.coordination"


def test_lower_layers_load_without_workflow_or_cli():
    code = (
        "import sys, marsys_mem.patterns, marsys_mem.coordination, marsys_mem.store;"
        "top = ('marsys_mem.workflow', 'marsys_mem.cli');"
        "loaded = [m for m in sys.modules if m.startswith(top)];"
        "assert not loaded, loaded;"
        "from marsys_mem import run_workflow, Workflow;"
        "assert 'marsys_mem.workflow' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
