"""The README stays short and the documentation site stays whole.

``mkdocs build --strict`` (run by ``.ci/run``) checks links inside the site; these checks
are the cheap ones that need no build: the README's length and links, the site's
navigation, and the workflow-file reference generated from the workflow JSON Schema.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml

from marsys_mem.workflow.models import workflow_schema

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_MAX_LINES = 250
_LINK = re.compile(r"\]\(((?:docs|notebooks|examples)/[^)#\s]+)(?:#[^)]*)?\)")


def _nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [page for item in node for page in _nav_pages(item)]
    if isinstance(node, dict):
        return [page for value in node.values() for page in _nav_pages(value)]
    return []


def _mkdocs_config() -> dict[str, object]:
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    config = yaml.safe_load(text)
    assert isinstance(config, dict)
    return config


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    links = _LINK.findall(text)
    assert len(links) >= 10, "the README links the guides"
    missing = sorted({link for link in links if not (ROOT / link).exists()})
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_page_of_docs_is_in_the_navigation():
    config = _mkdocs_config()
    nav = set(_nav_pages(config["nav"]))
    hidden = set(str(config.get("not_in_nav", "")).split())
    pages = {
        p.relative_to(DOCS).as_posix()
        for p in DOCS.rglob("*.md")
        if "hooks" not in p.relative_to(DOCS).parts
    }
    assert pages - nav - hidden == set(), "add the page to mkdocs.yml's nav"
    for page in nav:  # docs/notebooks links the notebooks folder
        assert (DOCS / page).is_file(), f"mkdocs.yml's nav names a missing page: {page}"


def test_the_workflow_reference_covers_every_definition_and_field():
    spec = importlib.util.spec_from_file_location(
        "workflow_schema_hook", DOCS / "hooks" / "workflow_schema.py"
    )
    assert spec is not None
    assert spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (DOCS / "reference" / "workflow-file.md").read_text(encoding="utf-8")
    rendered = hook.on_page_markdown(page, None, None, None)
    assert hook.MARKER not in rendered
    schema = workflow_schema()
    for name, definition in schema["$defs"].items():
        assert f"## {name} {{#{name.lower()}}}" in rendered, name
        for field in definition.get("properties", {}):
            assert f"| `{field}` |" in rendered, f"{name}.{field}"
    for field in schema["properties"]:
        assert f"| `{field}` |" in rendered, field
    # every step kind links to its model
    for kind in ("say", "tool", "share", "fork", "merge", "ask", "facts", "repeat"):
        assert f"`{kind}:` [" in rendered, kind
