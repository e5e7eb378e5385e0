"""MkDocs hook: the workflow-file reference, generated from the workflow's JSON Schema.

``docs/reference/workflow-file.md`` holds the marker ``<!-- workflow-schema -->``; at build
time it is replaced by one section per schema definition (the model's description and a
table of its fields: type, default, what it means), from the schema that
``marsys-mem schema --workflow`` prints (:func:`marsys_mem.workflow.models.workflow_schema`),
so the page cannot drift from the loader.
"""

from __future__ import annotations

import json
import re
from typing import Any

from marsys_mem.workflow.models import workflow_schema

MARKER = "<!-- workflow-schema -->"
_DEFS: set[str] = set()  # the schema's definition names, set by render()
# a field's meaning from any model's docstring, for models that share the field (an agent's
# overrides repeat the defaults' fields); set by render()
_MEANINGS: dict[str, str] = {}
_ARG = re.compile(r"^ {4}(\w+)(?: \([^)]*\))?: (.*)$")


def _anchor(name: str) -> str:
    return name.lower()


def _type(schema: dict[str, Any]) -> str:
    """A short, readable form of one property's schema."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    if "anyOf" in schema or "oneOf" in schema:
        parts = [_type(s) for s in schema.get("anyOf", schema.get("oneOf", []))]
        return " or ".join(dict.fromkeys(p for p in parts if p))
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " | ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items")
        return f"list of {_type(items)}" if isinstance(items, dict) and items else "list"
    if kind == "object":
        props = schema.get("properties", {})
        if len(props) == 1 and schema.get("required") == list(props):
            (key, value), = props.items()  # a step written `- KIND: {fields}`
            return f"`{key}:` {_type(value)}"
        if schema.get("title") in _DEFS:  # a model inlined rather than referenced
            return f"[{schema['title']}](#{_anchor(schema['title'])})"
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return f"map of {_type(extra)}"
        return "object"
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    if kind == "null":
        return "null"
    return str(kind) if kind else "any"


def _split_description(text: str) -> tuple[str, dict[str, str]]:
    """The description's prose (before ``Args:``/``Example:``) and its ``Args:`` entries."""
    prose: list[str] = []
    args: dict[str, str] = {}
    section = None
    current = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Attributes:", "Fields:"):
            section = "args"
            continue
        if stripped.endswith(":") and not line.startswith(" ") and stripped[:-1].isalpha():
            section = "other"
            continue
        if section is None:
            prose.append(line)
        elif section == "args":
            m = _ARG.match(line)
            if m:
                current = m.group(1)
                args[current] = m.group(2).strip()
            elif current and line.startswith("        "):
                args[current] += " " + stripped
    return "\n".join(prose).strip(), args


def _rst(text: str) -> str:
    """Sphinx roles and double backticks as plain Markdown code."""
    text = re.sub(r":\w+:`~?([^`]+)`", lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text)
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return _rst(text).replace("|", "\\|").replace("\n", " ")


def _section(name: str, schema: dict[str, Any], required_note: bool = True) -> str:
    prose, args = _split_description(schema.get("description", ""))
    out = [f"## {name} {{#{_anchor(name)}}}", ""]
    if prose:
        out += [_rst(prose), ""]
    props = schema.get("properties", {})
    if props:
        required = set(schema.get("required", []))
        out += ["| field | type | default | meaning |", "|---|---|---|---|"]
        for field, prop in props.items():
            default = (
                "required"
                if field in required
                else (f"`{json.dumps(prop['default'])}`" if "default" in prop else "")
            )
            meaning = args.get(field) or prop.get("description") or _MEANINGS.get(field, "")
            out.append(
                f"| `{field}` | {_cell(_type(prop))} | {_cell(default)} | "
                f"{_cell(meaning)} |"
            )
        out.append("")
        if schema.get("additionalProperties") is False and required_note:
            out += ["Unknown fields are errors.", ""]
    elif "enum" in schema or "anyOf" in schema or "type" in schema:
        out += [f"Type: {_type(schema)}", ""]
    return "\n".join(out)


def render() -> str:
    """The reference: the file's top level first, then every definition by name."""
    schema = workflow_schema()
    defs = schema.get("$defs", {})
    _DEFS.clear()
    _DEFS.update(defs)
    _MEANINGS.clear()
    for definition in defs.values():
        for field, meaning in _split_description(definition.get("description", ""))[1].items():
            _MEANINGS.setdefault(field, meaning)
    parts = [_section("Workflow", schema)]
    parts += [_section(name, defs[name]) for name in sorted(defs)]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the marker on the workflow-file page with the generated reference."""
    if MARKER in markdown:
        return markdown.replace(MARKER, render())
    return markdown
