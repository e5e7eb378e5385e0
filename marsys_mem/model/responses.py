"""OpenAI Responses API items in and out (what the OpenAI Agents SDK speaks).

The Responses API replaces Chat Completions' message list by a list of typed *items*.
This module translates between those items and Chat Completions message dicts, the shape
:mod:`marsys_mem.model.messages` already reads and writes, so that
``Message.from_llm_dict(item)`` accepts Responses items and
``to_llm_format(messages, "responses")`` emits them. It works on plain dicts only (it sits
below ``messages`` and imports nothing from it).

In (one item or one response, to one message):

* ``message`` items (``input_text`` / ``output_text`` / ``input_image`` parts, or a plain
  string) become a message of their role; ``developer`` becomes ``system`` with
  ``metadata["responses_role"] = "developer"``; a ``refusal`` part's text goes to
  ``metadata["refusal"]``. The item's ``id`` and ``status`` go to metadata.
* ``function_call`` becomes an assistant message with one tool call:
  ``call_id`` is ``ToolCall.id``, ``arguments`` (a JSON object as a string) is parsed.
* ``function_call_output`` becomes a tool message; ``call_id`` is its ``tool_call_id``.
* A whole response (``{"object": "response", "output": [...]}``) becomes one assistant
  message: the text of its message items, its function calls as tool calls; ``id``,
  ``model``, ``usage`` and ``status`` go to metadata.
* **Every other item** (``reasoning``, hosted tool calls such as ``web_search_call``,
  ``item_reference``, ...) is kept verbatim in ``metadata["responses_items"]`` of the
  message built from it (a lone such item: an assistant message with no content), and is
  emitted again, in front of that message's own items, by ``to_llm_format(...,
  "responses")``. So reasoning items travel with the message they precede.

Out (a message, to input items): system/user/developer and assistant text become
``{"type": "message", "role": ..., "content": ...}`` (images as ``input_image`` parts),
each tool call a ``function_call`` item, a tool result a ``function_call_output`` item.
Chat Completions names (``name``) have no Responses field and are not sent; agent calls and
responses are sent as Chat Completions sends them (user ``[Request from X]: ...`` /
assistant).
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

from marsys_mem.exceptions import MessageFormatError

__all__ = [
    "RESPONSES_PART_TYPES",
    "chat_from_responses",
    "is_responses_dict",
    "responses_from_chat",
]

RESPONSES_PART_TYPES = frozenset(
    ("input_text", "output_text", "input_image", "input_file", "input_audio", "refusal")
)
"""Content part types that only the Responses API uses (Chat uses ``text``/``image_url``)."""

_MESSAGE_ROLES = frozenset(("user", "system", "developer", "assistant"))


def is_responses_dict(data: Mapping[str, Any]) -> bool:
    """Whether a provider dict is a Responses API response or item (not Chat / Anthropic).

    Example:
        >>> is_responses_dict({"type": "function_call", "call_id": "c1", "name": "f"})
        True
        >>> is_responses_dict({"role": "user", "content": "hi"})
        False
    """
    if data.get("object") == "response":
        return True
    if "role" not in data and isinstance(data.get("output"), list):
        return True
    kind = data.get("type")
    if isinstance(kind, str) and kind != "message" and "role" not in data:
        return True  # function_call, function_call_output, reasoning, hosted tool calls ...
    if kind == "message" or "role" in data:
        if data.get("role") == "developer":
            return True
        content = data.get("content")
        if isinstance(content, list):
            return any(
                isinstance(p, Mapping) and p.get("type") in RESPONSES_PART_TYPES for p in content
            )
    return False


def _plain(value: Any) -> Any:
    """A deep, mutable, plain copy of a JSON value (dicts and lists at any depth)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlevel = 3


def _short(value: Any) -> str:
    """A bounded repr for error messages (never the whole of a huge value)."""
    return _REPR.repr(value)


# ---------------------------------------------------------------------- in
def _chat_parts(
    content: Sequence[Any], where: str, metadata: dict[str, Any]
) -> list[dict[str, Any]]:
    """Responses content parts as Chat Completions parts (refusals to metadata)."""
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise MessageFormatError(f"{where}[{i}] is not a dict: {_short(part)}")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal":
            metadata["refusal"] = part["refusal"]
        elif kind == "input_image" and part.get("image_url"):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise MessageFormatError(
                f"{where}[{i}].type {_short(kind)} is not supported here: use "
                "input_text, output_text, refusal or input_image with an image_url"
            )
    return parts


def _collapse(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]] | None:
    """Text-only parts as one string (as people write it); ``None`` when there are none."""
    if not parts:
        return None
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _call(item: Mapping[str, Any]) -> dict[str, Any]:
    """A ``function_call`` item as a Chat Completions tool call."""
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"},
    }


def _keep(data: Mapping[str, Any], metadata: dict[str, Any], *keys: str) -> None:
    for key in keys:
        if data.get(key) is not None:
            metadata[key] = data[key]


def _message_item(item: Mapping[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    role = item.get("role")
    if role not in _MESSAGE_ROLES:
        raise MessageFormatError(
            f"message item role {_short(role)} is not one of {sorted(_MESSAGE_ROLES)}"
        )
    if role == "developer":
        role = "system"
        metadata["responses_role"] = "developer"
    content = item.get("content")
    if isinstance(content, list):
        content = _collapse(_chat_parts(content, "content", metadata))
    elif content is not None and not isinstance(content, str):
        raise MessageFormatError(f"content must be a string or a list of parts: {_short(content)}")
    _keep(item, metadata, "id", "status")
    return {"role": role, "content": content}


def _response(data: Mapping[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    """A whole response: its output items as one assistant message."""
    output = data.get("output")
    if not isinstance(output, list):
        raise MessageFormatError(f"response output must be a list of items: {_short(output)}")
    _keep(data, metadata, "id", "model", "usage", "status")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    passthrough: list[Any] = []
    for i, item in enumerate(output):
        if not isinstance(item, Mapping):
            raise MessageFormatError(f"output[{i}] is not a dict: {_short(item)}")
        kind = item.get("type")
        if kind == "message":
            parts = _chat_parts(item.get("content") or [], f"output[{i}].content", metadata)
            texts.extend(p["text"] for p in parts if p["type"] == "text")
        elif kind == "function_call":
            calls.append(_call(item))
        else:
            passthrough.append(_plain(item))
    if passthrough:
        metadata["responses_items"] = passthrough
    chat: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        chat["tool_calls"] = calls
    return chat


def chat_from_responses(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Responses item or response as a Chat Completions message dict and its metadata.

    Raises:
        MessageFormatError: a malformed item (a wrong role, content or part type).
        KeyError: a required field is missing (``Message.from_llm_dict`` names it).

    Example:
        >>> chat_from_responses({"type": "function_call_output", "call_id": "c1", "output": "72F"})
        ({'role': 'tool', 'tool_call_id': 'c1', 'content': '72F'}, {})
    """
    metadata: dict[str, Any] = {}
    if data.get("object") == "response" or ("type" not in data and "role" not in data):
        return _response(data, metadata), metadata
    kind = data.get("type", "message")
    if kind == "message":
        return _message_item(data, metadata), metadata
    if kind == "function_call":
        _keep(data, metadata, "id", "status")
        return {"role": "assistant", "content": None, "tool_calls": [_call(data)]}, metadata
    if kind == "function_call_output":
        _keep(data, metadata, "id", "status")
        output = data["output"]
        if isinstance(output, list):
            output = _collapse(_chat_parts(output, "output", metadata)) or ""
        elif not isinstance(output, str):
            raise MessageFormatError(
                f"output must be a string or a list of parts: {_short(output)}"
            )
        return {"role": "tool", "tool_call_id": data["call_id"], "content": output}, metadata
    metadata["responses_items"] = [_plain(data)]
    return {"role": "assistant", "content": None}, metadata


# ---------------------------------------------------------------------- out
def _input_parts(content: Any, *, assistant: bool) -> str | list[dict[str, Any]]:
    """Chat content (a string or parts) as Responses content."""
    if isinstance(content, str) or content is None:
        return content or ""
    if assistant:  # an assistant's input message holds text only
        return "\n".join(p["text"] for p in content if p.get("type") == "text")
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") == "text":
            parts.append({"type": "input_text", "text": part["text"]})
        elif part.get("type") == "image_url":
            url = part["image_url"]["url"]
            parts.append({"type": "input_image", "image_url": url, "detail": "auto"})
    return parts


def responses_from_chat(
    chat: Mapping[str, Any], metadata: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The Responses input items of one Chat Completions message dict (and its metadata).

    Example:
        >>> call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        >>> [i["type"] for i in responses_from_chat(
        ...     {"role": "assistant", "content": "on it", "tool_calls": [call]}, {})]
        ['message', 'function_call']
    """
    kept = metadata.get("responses_items") or ()
    items: list[dict[str, Any]] = [_plain(i) for i in kept if isinstance(i, Mapping)]
    role = chat["role"]
    if role == "tool":
        call_id, output = chat["tool_call_id"], chat["content"]
        items.append({"type": "function_call_output", "call_id": call_id, "output": output})
        return items
    calls = chat.get("tool_calls") or []
    content = _input_parts(chat.get("content"), assistant=role == "assistant")
    if content or not (calls or items):
        if role == "system" and metadata.get("responses_role") == "developer":
            role = "developer"
        items.append({"type": "message", "role": role, "content": content})
    items.extend(
        {
            "type": "function_call",
            "call_id": c["id"],
            "name": c["function"]["name"],
            "arguments": c["function"]["arguments"],
        }
        for c in calls
    )
    return items
