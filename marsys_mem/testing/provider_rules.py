"""The providers' documented request rules, checked: what a real API would refuse with a 400.

One set of validators for the loopback server (:mod:`marsys_mem.testing.llm_server`, which
answers a request that breaks a rule with the provider's own 400 error body) and for tests
(which check that what ``to_llm_format`` and the window builders produce would be accepted).

Rules checked, per API (from the providers' API references and the errors they return):

* **Anthropic Messages** (``POST /v1/messages``): at least one message; roles are ``user`` or
  ``assistant`` (system text goes in the top-level ``system``, a string or text blocks); the
  first message is ``user``; roles alternate (consecutive same-role turns must be merged);
  content is a non-empty string or non-empty blocks, text blocks non-empty (except the final
  assistant message); every ``tool_use`` is answered by a ``tool_result`` in the very next
  message, which is a user message whose ``tool_result`` blocks come first; every
  ``tool_result`` answers a ``tool_use`` of the message right before it; ``tool_use`` ids are
  unique. As a request: ``model`` and ``max_tokens`` (an integer >= 1) are required.
* **OpenAI Chat Completions** (``POST /v1/chat/completions``): at least one message; known
  roles; a ``tool`` message answers a ``tool_calls`` id of the assistant message it follows,
  with only tool messages in between; an assistant message with ``tool_calls`` is followed by
  a tool message for each id before anything else; an assistant message has content or tool
  calls. As a request: ``model`` is required.
* **OpenAI Responses** (``POST /v1/responses``): ``input`` is a string or a list of items;
  each ``function_call_output`` comes after the ``function_call`` with its ``call_id``; each
  ``function_call`` has an output; ``message`` items have a known role. As a request:
  ``model`` is required.

A :class:`Violation` knows the provider's error body (Anthropic:
``{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}``; OpenAI:
``{"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": None}}``).

Example:
    >>> from marsys_mem import Message
    >>> from marsys_mem.model.messages import to_llm_format
    >>> payload = to_llm_format([Message.assistant("Hello!"), Message.user("hi")], "anthropic")
    >>> [v.message for v in anthropic_violations(payload)]
    ['messages: first message must use the "user" role']
    >>> chat_violations(to_llm_format([Message.user("hi")], "openai"))
    []
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ApiName",
    "Violation",
    "anthropic_violations",
    "api_of_path",
    "assert_accepted",
    "chat_violations",
    "request_violations",
    "responses_violations",
]

ApiName = Literal["anthropic", "openai", "responses"]
"""The APIs checked: Anthropic Messages, OpenAI Chat Completions, OpenAI Responses."""

_CHAT_ROLES = frozenset(("system", "developer", "user", "assistant", "tool", "function"))
_RESPONSES_ROLES = frozenset(("system", "developer", "user", "assistant"))


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken request rule, as the provider would report it.

    Attributes:
        api: the API whose rule it is.
        message: the provider's error message.
        param: OpenAI's ``param`` (where in the request); Anthropic has none.

    Example:
        >>> v = Violation("anthropic", 'messages: first message must use the "user" role')
        >>> v.error_body()["error"]["type"], v.status
        ('invalid_request_error', 400)
    """

    api: ApiName
    message: str
    param: str | None = None

    @property
    def status(self) -> int:
        """The HTTP status the provider answers with (400)."""
        return 400

    def error_body(self) -> dict[str, Any]:
        """The provider's JSON error body for this violation."""
        if self.api == "anthropic":
            return {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": self.message},
            }
        return {
            "error": {
                "message": self.message,
                "type": "invalid_request_error",
                "param": self.param,
                "code": None,
            }
        }


# ---------------------------------------------------------------------- Anthropic
def _blocks(content: Any) -> list[Mapping[str, Any]] | None:
    """Content as a list of blocks (a string is one text block); ``None``: not valid."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list) and all(isinstance(b, Mapping) for b in content):
        return content
    return None


def _anthropic_system(system: Any) -> list[Violation]:
    if system is None or isinstance(system, str):
        return []
    if isinstance(system, list) and all(
        isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str)
        for b in system
    ):
        return []
    message = "system: Input should be a valid string or a list of text blocks"
    return [Violation("anthropic", message)]


def anthropic_violations(payload: Mapping[str, Any], *, request: bool = False) -> list[Violation]:
    """The Anthropic Messages rules ``payload`` breaks (``[]``: the API would accept it).

    Args:
        payload: ``{"messages": [...], "system": ...}`` (what ``to_llm_format(...,
            "anthropic")`` returns) or a whole request body.
        request: also require the request fields (``model``, ``max_tokens``).

    Example:
        >>> anthropic_violations({"messages": [{"role": "user", "content": "hi"}]})
        []
        >>> anthropic_violations({"messages": []})[0].message
        'messages: at least one message is required'
    """
    out: list[Violation] = []

    def bad(message: str) -> None:
        out.append(Violation("anthropic", message))

    if request:
        if not isinstance(payload.get("model"), str):
            bad("model: Field required")
        tokens = payload.get("max_tokens")
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            bad("max_tokens: Field required (an integer >= 1)")
    out.extend(_anthropic_system(payload.get("system")))
    messages = payload.get("messages")
    if not isinstance(messages, list):
        bad("messages: Field required")
        return out
    if not messages:
        bad("messages: at least one message is required")
        return out
    seen_ids: set[str] = set()
    previous_uses: list[str] = []  # tool_use ids of the message before
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, Mapping) else None
        if role not in ("user", "assistant"):
            bad(f"messages.{i}.role: Input should be 'user' or 'assistant'")
            return out
        if i == 0 and role != "user":
            bad('messages: first message must use the "user" role')
        if i > 0 and messages[i - 1].get("role") == role:
            bad(
                'messages: roles must alternate between "user" and "assistant", but found '
                f'multiple "{role}" roles in a row'
            )
        blocks = _blocks(msg.get("content"))
        if blocks is None:
            bad(f"messages.{i}.content: Input should be a valid string or list of blocks")
            previous_uses = []
            continue
        final_assistant = role == "assistant" and i == len(messages) - 1
        if not blocks and not final_assistant:
            bad(f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message")
        uses: list[str] = []
        results: list[str] = []
        text_seen = False
        for j, block in enumerate(blocks):
            kind = block.get("type")
            if kind == "text":
                text_seen = True
                if not block.get("text") and not final_assistant:
                    bad(f"messages.{i}.content.{j}: text content blocks must be non-empty")
            elif kind == "tool_use":
                if role != "assistant":
                    bad(f"messages.{i}.content.{j}: tool_use blocks are only allowed in "
                        "assistant messages")
                tid = block.get("id")
                if not isinstance(tid, str) or not isinstance(block.get("name"), str):
                    bad(f"messages.{i}.content.{j}: tool_use needs an id and a name")
                    continue
                if not isinstance(block.get("input"), Mapping):
                    bad(f"messages.{i}.content.{j}.input: Input should be a valid dictionary")
                if tid in seen_ids:
                    bad(f"messages.{i}.content.{j}: `tool_use` ids must be unique")
                seen_ids.add(tid)
                uses.append(tid)
            elif kind == "tool_result":
                if role != "user":
                    bad(f"messages.{i}.content.{j}: tool_result blocks are only allowed in "
                        "user messages")
                if text_seen or any(b.get("type") != "tool_result" for b in blocks[:j]):
                    bad(f"messages.{i}.content.{j}: `tool_result` blocks must come first in "
                        "the content of a user message, before any other block")
                rid = block.get("tool_use_id")
                if rid not in previous_uses:
                    bad(f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {rid}. Each `tool_result` block must have a "
                        "corresponding `tool_use` block in the previous message.")
                results.append(str(rid))
            else:
                text_seen = True  # images, documents: content that is not a tool result
        missing = [u for u in previous_uses if u not in results]
        if missing:
            bad(f"messages.{i - 1}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message.")
        previous_uses = uses
    if previous_uses:
        bad(f"messages.{len(messages) - 1}: `tool_use` ids were found without `tool_result` "
            f"blocks immediately after: {', '.join(previous_uses)}. Each `tool_use` block must "
            "have a corresponding `tool_result` block in the next message.")
    return out


# ---------------------------------------------------------------------- OpenAI Chat
def chat_violations(
    payload: Sequence[Mapping[str, Any]] | Mapping[str, Any], *, request: bool = False
) -> list[Violation]:
    """The Chat Completions rules a message list (or request body) breaks.

    Args:
        payload: a list of message dicts (``to_llm_format(..., "openai")``) or a request
            body with ``messages``.
        request: also require the request fields (``model``).

    Example:
        >>> chat_violations([{"role": "tool", "tool_call_id": "c1", "content": "72F"}])[0].param
        'messages.[0].role'
    """
    out: list[Violation] = []

    def bad(message: str, param: str | None) -> None:
        out.append(Violation("openai", message, param))

    if isinstance(payload, Mapping):
        if request and not isinstance(payload.get("model"), str):
            bad("you must provide a model parameter", "model")
        messages = payload.get("messages")
    else:
        messages = list(payload)
    if not isinstance(messages, list):
        bad("Missing required parameter: 'messages'.", "messages")
        return out
    if not messages:
        bad("[] is too short - 'messages'", "messages")
        return out
    pending: list[str] = []  # tool_call ids still to answer
    pending_at = -1
    answerable: set[str] = set()  # ids of the calls the current run of tool messages answers
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, Mapping) else None
        if role not in _CHAT_ROLES:
            bad(f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', "
                "'user', 'function', 'tool', and 'developer'.", f"messages.[{i}].role")
            return out
        if role == "tool":
            cid = msg.get("tool_call_id")
            if cid not in answerable:
                bad("Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.", f"messages.[{i}].role")
            else:
                answerable.discard(cid)
                if cid in pending:
                    pending.remove(cid)
            continue
        if pending:
            bad("An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(pending)}", f"messages.[{pending_at}].role")
        pending, answerable = [], set()
        if role == "assistant":
            calls = msg.get("tool_calls") or []
            content = msg.get("content")
            if not calls and content is None:
                bad("Invalid value for 'content': expected a string, got null.",
                    f"messages.[{i}].content")
            ids = [c.get("id") for c in calls if isinstance(c, Mapping)]
            if len(ids) != len(calls) or not all(isinstance(x, str) for x in ids):
                bad("Missing required parameter: 'tool_calls.id'.", f"messages.[{i}].tool_calls")
            pending = [str(x) for x in ids]
            answerable = set(pending)
            pending_at = i
        elif msg.get("content") is None and role != "function":
            bad("Invalid value for 'content': expected a string, got null.",
                f"messages.[{i}].content")
    if pending:
        bad("An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(pending)}", f"messages.[{pending_at}].role")
    return out


# ---------------------------------------------------------------------- OpenAI Responses
def responses_violations(
    payload: Sequence[Mapping[str, Any]] | Mapping[str, Any] | str, *, request: bool = False
) -> list[Violation]:
    """The Responses API rules an input item list (or request body) breaks.

    Args:
        payload: a list of input items (``to_llm_format(..., "responses")``), an input
            string, or a request body with ``input``.
        request: also require the request fields (``model``).

    Example:
        >>> items = [{"type": "function_call_output", "call_id": "c1", "output": "72F"}]
        >>> responses_violations(items)[0].message
        'No tool call found for function call output with call_id c1.'
    """
    out: list[Violation] = []

    def bad(message: str, param: str | None = "input") -> None:
        out.append(Violation("responses", message, param))

    if isinstance(payload, Mapping):
        if request and not isinstance(payload.get("model"), str):
            bad("Missing required parameter: 'model'.", "model")
        items: Any = payload.get("input")
    else:
        items = payload
    if isinstance(items, str):
        return out
    if not isinstance(items, list):
        bad("Missing required parameter: 'input'.")
        return out
    calls: set[str] = set()
    answered: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            bad(f"Invalid type for 'input[{i}]': expected an object.", f"input[{i}]")
            continue
        kind = item.get("type", "message")
        if kind == "function_call":
            cid = item.get("call_id")
            if not isinstance(cid, str) or not isinstance(item.get("name"), str):
                bad(f"Missing required parameter: 'input[{i}].call_id'.", f"input[{i}]")
                continue
            calls.add(cid)
        elif kind == "function_call_output":
            cid = item.get("call_id")
            if cid not in calls:
                bad(f"No tool call found for function call output with call_id {cid}.")
            answered.add(str(cid))
        elif kind == "message":
            if item.get("role") not in _RESPONSES_ROLES:
                bad(f"Invalid value: '{item.get('role')}'. Supported values are: 'assistant', "
                    "'system', 'developer', and 'user'.", f"input[{i}].role")
    for cid in sorted(calls - answered):
        bad(f"No tool output found for function call {cid}.")
    return out


# ---------------------------------------------------------------------- dispatch
def api_of_path(path: str) -> ApiName | None:
    """Which API a request path is for (``None``: none checked here).

    Example:
        >>> api_of_path("/v1/messages"), api_of_path("/v1/chat/completions?x=1")
        ('anthropic', 'openai')
    """
    bare = path.split("?", 1)[0].rstrip("/")
    if bare.endswith("/chat/completions"):
        return "openai"
    if bare.endswith("/messages"):
        return "anthropic"
    if bare.endswith("/responses"):
        return "responses"
    return None


def request_violations(path: str, body: Mapping[str, Any]) -> list[Violation]:
    """The rules a request body sent to ``path`` breaks, by the API the path names.

    Example:
        >>> body = {"model": "m", "max_tokens": 5,
        ...         "messages": [{"role": "assistant", "content": "Hi"}]}
        >>> request_violations("/v1/messages", body)[0].error_body()["error"]["message"]
        'messages: first message must use the "user" role'
    """
    api = api_of_path(path)
    if api == "anthropic":
        return anthropic_violations(body, request=True)
    if api == "openai":
        return chat_violations(body, request=True)
    if api == "responses":
        return responses_violations(body, request=True)
    return []


def assert_accepted(api: ApiName, payload: Any) -> None:
    """Raise ``AssertionError`` listing the rules ``payload`` breaks, if any.

    ``payload`` is what ``to_llm_format(messages, api)`` returns.

    Example:
        >>> assert_accepted("openai", [{"role": "user", "content": "hi"}])
    """
    check = {
        "anthropic": anthropic_violations,
        "openai": chat_violations,
        "responses": responses_violations,
    }[api]
    found = check(payload)
    if found:
        lines = "\n".join(f"- {v.message}" for v in found)
        raise AssertionError(f"the {api} API would refuse this request:\n{lines}\n{payload!r}")
