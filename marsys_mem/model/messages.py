r"""Typed, immutable messages and their provider formats.

A :class:`Message` is a frozen pydantic model. Its ``role`` is one of ``system``, ``user``,
``assistant``, ``tool``, ``agent_call`` (a request from another agent) and ``agent_response``
(an agent's answer to such a request). Messages go out to a provider with
:func:`to_llm_format` (OpenAI Chat Completions, OpenAI Responses or Anthropic shapes) and
come back in with :meth:`Message.from_llm_dict` (Responses items: see
:mod:`marsys_mem.model.responses`).

Serialisation: ``Message.model_dump_json()`` / ``Message.model_validate_json()`` round-trip
every field losslessly; :data:`MESSAGE_LIST_ADAPTER` does the same for lists.

Text: every string of a message and its parts (content, text parts, names, ids, image URLs,
tool call arguments, metadata and structured data, keys and values at any depth) must encode
as UTF-8. A lone surrogate such as ``"bad \udc80"`` (what ``bytes.decode(errors=
"surrogateescape")`` produces) is rejected at construction with a ``ValidationError`` naming
the field and the path inside it, so it never reaches a store or a provider.

Backward compatibility: fields may be added with defaults; existing fields keep their names
and JSON shapes. ``pinned`` and ``metadata["preserve"] = True`` mean the same thing.
"""

from __future__ import annotations

import itertools
import json
import reprlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, overload

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from marsys_mem.exceptions import MessageFormatError
from marsys_mem.model.responses import chat_from_responses, is_responses_dict, responses_from_chat

__all__ = [
    "MESSAGE_LIST_ADAPTER",
    "AgentCall",
    "ContentPart",
    "FrozenDict",
    "FrozenList",
    "ImagePart",
    "Message",
    "Provider",
    "Role",
    "TextPart",
    "ToolCall",
    "content_text",
    "freeze_json",
    "is_user_turn",
    "provider_order",
    "to_llm_format",
]

Role = Literal["system", "user", "assistant", "tool", "agent_call", "agent_response"]
Provider = Literal["openai", "anthropic", "responses"]

_ROLES: frozenset[str] = frozenset(
    ("system", "user", "assistant", "tool", "agent_call", "agent_response")
)


def _read_only(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise TypeError(
        "messages are immutable: build a new one, e.g. message.model_copy(update={...})"
    )


class FrozenDict(dict[str, Any]):
    """A read-only dict: what a message's dict fields hold (compares equal to a dict).

    Example:
        >>> d = FrozenDict({"a": 1})
        >>> d == {"a": 1}, dict(d) | {"b": 2}
        (True, {'a': 1, 'b': 2})
    """

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))


class FrozenList(list[Any]):
    """A read-only list: what a message's list fields hold (compares equal to a list).

    Example:
        >>> FrozenList([1, 2]) == [1, 2]
        True
    """

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only
    append = extend = insert = remove = pop = clear = sort = reverse = _read_only

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))


def _short(value: Any) -> str:
    """A bounded, ASCII-safe repr for error messages (never the whole of a huge value)."""
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlevel = 3


class _NotUtf8(ValueError):
    """Internal: a string that UTF-8 cannot encode (a lone surrogate) inside a JSON value."""


def _bad_char(text: str) -> tuple[int, str] | None:
    """Index and character of the first code point UTF-8 cannot encode, or ``None``."""
    if text.isascii():  # the common case: no scan beyond a C loop, no allocation
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start, text[exc.start]
    return None


def _utf8_error(where: str, text: str, bad: tuple[int, str]) -> str:
    return (
        f"{where} is not valid UTF-8 text: lone surrogate {bad[1]!r} at index {bad[0]} "
        f"(in {_short(text)}); decode bytes with errors='replace' or strip surrogates"
    )


def _check_text(text: str, info: ValidationInfo) -> str:
    """AfterValidator of every plain str field: reject what UTF-8 cannot encode."""
    if text.isascii():
        return text
    bad = _bad_char(text)
    if bad is not None:
        raise ValueError(_utf8_error(info.field_name or "text", text, bad))
    return text


_Text = Annotated[str, AfterValidator(_check_text)]
"""A str that encodes as UTF-8 (no lone surrogates): what every text field of a message is."""


def freeze_json(value: Any) -> Any:
    """Deep read-only copy of a JSON value; rejects NaN, Infinity and non-UTF-8 text.

    Dicts become :class:`FrozenDict`, lists :class:`FrozenList`, at any depth: what every
    JSON field of a message (and of a :class:`~marsys_mem.model.facts.SharedFact`) holds.

    Raises:
        ValueError: NaN or Infinity, or a string (or key) that does not encode as UTF-8.

    Example:
        >>> frozen = freeze_json({"a": [1, {"b": 2}]})
        >>> type(frozen).__name__, type(frozen["a"]).__name__
        ('FrozenDict', 'FrozenList')
    """
    if isinstance(value, str):
        if not value.isascii() and _bad_char(value) is not None:
            raise _NotUtf8("text is not valid UTF-8 (it holds a lone surrogate)")
        return value
    if isinstance(value, dict):
        out = FrozenDict({k: freeze_json(v) for k, v in value.items()})
        for k in out:
            if isinstance(k, str) and not k.isascii() and _bad_char(k) is not None:
                raise _NotUtf8("a key is not valid UTF-8 (it holds a lone surrogate)")
        return out
    if isinstance(value, list):
        return FrozenList(freeze_json(v) for v in value)
    if isinstance(value, float) and (value != value or value in (_INF, -_INF)):
        raise ValueError(f"{value} is not valid JSON (NaN and Infinity are not allowed)")
    return value


def _find_not_utf8(value: Any, path: str) -> tuple[str, str, tuple[int, str]] | None:
    """(path, text, (index, char)) of the first non-UTF-8 string in a JSON value (slow path)."""
    if isinstance(value, str):
        bad = _bad_char(value)
        return None if bad is None else (path, value, bad)
    if isinstance(value, dict):
        for k, v in value.items():
            bad = _bad_char(k)
            if bad is not None:
                return f"{path} key", k, bad
            found = _find_not_utf8(v, f"{path}[{_short(k)}]")
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _find_not_utf8(v, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _freeze_field(value: Any, field: str) -> Any:
    """:func:`freeze_json`, with a non-UTF-8 string reported by its path inside ``field``."""
    try:
        return freeze_json(value)
    except _NotUtf8:
        found = _find_not_utf8(value, field)
        assert found is not None
        raise ValueError(_utf8_error(*found)) from None


def _thaw(value: Any) -> Any:
    """Deep mutable copy (for payloads handed to callers)."""
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_thaw(v) for v in value]
    return value


_INF = float("inf")


def _new_id() -> str:
    return uuid.uuid4().hex


def _utcnow() -> datetime:
    return datetime.now(UTC)


class TextPart(BaseModel):
    """A text block inside a multi-part message content.

    Example:
        >>> TextPart(text="hello").text
        'hello'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["text"] = "text"
    text: _Text


class ImagePart(BaseModel):
    """An image inside a multi-part message content: an http(s) URL or a ``data:`` URI.

    Example:
        >>> ImagePart(url="https://example.com/cat.png").type
        'image'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["image"] = "image"
    url: _Text = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ToolCall(BaseModel):
    """A tool (function) call requested by an assistant message.

    Example:
        >>> ToolCall(id="c1", name="weather", arguments={"city": "Tokyo"}).name
        'weather'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: _Text = Field(default_factory=lambda: "call_" + _new_id(), min_length=1)
    name: _Text = Field(min_length=1)
    arguments: dict[str, JsonValue] = Field(default_factory=FrozenDict)

    _freeze_arguments = field_validator("arguments")(lambda v: _freeze_field(v, "arguments"))


class AgentCall(BaseModel):
    """A request from one agent to another, carried by an assistant message.

    Example:
        >>> AgentCall(agent="researcher", request="Find Q4 numbers").agent
        'researcher'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: _Text = Field(default_factory=lambda: "agent_" + _new_id(), min_length=1)
    agent: _Text = Field(min_length=1)
    request: str | dict[str, JsonValue]

    _freeze_request = field_validator("request")(lambda v: _freeze_field(v, "request"))


Content = str | dict[str, JsonValue] | list[ContentPart] | None


class Message(BaseModel):
    """One immutable conversation message.

    Build messages with the role constructors; every other field may be given as a keyword.
    ``pinned=True`` (or ``metadata={"preserve": True}``) keeps a message in every context
    window. Two messages are equal when all their fields are equal; they hash by id.

    Example:
        >>> m = Message.user("Weather in Tokyo?", name="alice", pinned=True)
        >>> m.role, m.is_protected
        ('user', True)
        >>> call = ToolCall(id="c1", name="weather", arguments={"city": "Tokyo"})
        >>> a = Message.assistant("", tool_calls=[call])
        >>> Message.tool("72F", tool_call_id="c1", name="weather").tool_call_id
        'c1'
        >>> Message.model_validate_json(m.model_dump_json()) == m
        True
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role
    content: Content = None
    message_id: _Text = Field(default_factory=_new_id, min_length=1)
    name: _Text | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: _Text | None = None
    agent_calls: tuple[AgentCall, ...] = ()
    structured_data: dict[str, JsonValue] | None = None
    images: tuple[_Text, ...] = ()
    metadata: dict[str, JsonValue] = Field(default_factory=FrozenDict)
    timestamp: AwareDatetime = Field(default_factory=_utcnow)
    pinned: bool = False

    @field_validator("timestamp")
    @classmethod
    def _to_utc(cls, value: datetime) -> datetime:
        return value.astimezone(UTC)

    @field_validator("content", "metadata", "structured_data")
    @classmethod
    def _freeze_json(cls, value: Any, info: ValidationInfo) -> Any:
        return _freeze_field(value, info.field_name or "value")

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Message:
        """A copy; with ``update`` the copy is re-validated (and its cached counts reset)."""
        if update:
            return type(self).model_validate({**self.__dict__, **update})
        return super().model_copy(deep=deep)

    @model_validator(mode="after")
    def _check_role_fields(self) -> Message:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"tool_calls are only allowed on assistant messages, not {self.role}")
        if self.role == "tool":
            if not self.tool_call_id:
                raise ValueError(
                    "a tool message needs tool_call_id (the id of the call it answers)"
                )
        elif self.tool_call_id is not None:
            raise ValueError(f"tool_call_id is only allowed on tool messages, not {self.role}")
        if self.role == "agent_call" and not self.name:
            raise ValueError("an agent_call message needs name= (the calling agent)")
        ids = [c.id for c in self.tool_calls]
        if len(ids) != len(set(ids)):
            raise ValueError(f"tool call ids repeat within one message: {ids}")
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash(self.message_id)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def system(cls, content: Content, **fields: Any) -> Message:
        """A system message (instructions); always kept in context windows."""
        return cls(role="system", content=content, **fields)

    @classmethod
    def user(cls, content: Content, **fields: Any) -> Message:
        """A user message."""
        return cls(role="user", content=content, **fields)

    @classmethod
    def assistant(cls, content: Content = None, **fields: Any) -> Message:
        """An assistant message, optionally with ``tool_calls`` or ``agent_calls``."""
        return cls(role="assistant", content=content, **fields)

    @classmethod
    def tool(cls, content: Content, *, tool_call_id: str, **fields: Any) -> Message:
        """A tool result answering the call ``tool_call_id``."""
        return cls(role="tool", content=content, tool_call_id=tool_call_id, **fields)

    @classmethod
    def agent_call(cls, content: Content, *, name: str, **fields: Any) -> Message:
        """A request from agent ``name`` to this agent."""
        return cls(role="agent_call", content=content, name=name, **fields)

    @classmethod
    def agent_response(cls, content: Content, **fields: Any) -> Message:
        """An agent's answer to another agent's request (``name``: the answering agent)."""
        return cls(role="agent_response", content=content, **fields)

    # ------------------------------------------------------------------ views
    @property
    def is_protected(self) -> bool:
        """True for system and pinned messages: context windows always keep them."""
        return self.role == "system" or self.pinned or self.metadata.get("preserve") is True

    @property
    def text(self) -> str:
        """The content as plain text (parts joined, dicts as JSON, ``None`` as ``""``)."""
        return content_text(self.content)

    # ------------------------------------------------------------------ input processor
    @classmethod
    def from_llm(cls, response: Any) -> Message:
        """Build a message from a provider response: an SDK object or its dict.

        Accepts what :meth:`from_llm_dict` accepts, and the official SDKs' response objects
        (``openai`` ``ChatCompletion`` and ``Response``, ``anthropic`` ``Message``, their
        items and messages: any pydantic model, read through ``model_dump``).

        Raises:
            MessageFormatError: as :meth:`from_llm_dict`.

        Example:
            >>> Message.from_llm({"role": "assistant", "content": "Hi"}).text
            'Hi'
        """
        return cls.from_llm_dict(response)

    @classmethod
    def from_llm_dict(cls, data: Mapping[str, Any]) -> Message:
        """Build a message from an OpenAI or Anthropic response or message dict.

        Accepts an OpenAI chat-completion response (``{"choices": [...]}``), an OpenAI
        message (``{"role": ..., "content": ..., "tool_calls": [...]}``), an Anthropic
        response (``{"type": "message", "content": [blocks]}``) or an Anthropic message,
        and an OpenAI Responses API response or item (``message``, ``function_call``,
        ``function_call_output``; other items are kept in ``metadata["responses_items"]``,
        see :mod:`marsys_mem.model.responses`). Model name, usage and stop reason go to
        ``metadata``. An SDK response object (a pydantic model) is read as its dict,
        ``model_dump(mode="json", exclude_none=True)``.

        Raises:
            MessageFormatError: any malformed input (not a dict, neither shape, a missing or
                wrongly typed field, non-JSON or too deeply nested tool arguments, text that
                is not UTF-8); the message names the field and shows at most a bounded repr
                of the value.
        """
        if isinstance(data, BaseModel) and not isinstance(data, Message):
            data = data.model_dump(mode="json", exclude_none=True)  # an SDK response object
        if not isinstance(data, Mapping):
            raise MessageFormatError(f"expected a dict, got {type(data).__name__}")
        try:
            return _from_llm_dict(data)
        except MessageFormatError:
            raise
        except ValidationError as exc:
            raise MessageFormatError(_safe(f"invalid message dict: {_errors(exc)}")) from exc
        except RecursionError as exc:
            raise MessageFormatError("message dict is nested too deeply") from exc
        except KeyError as exc:
            key = _short(exc.args[0]) if exc.args else "?"
            raise MessageFormatError(
                _safe(f"message dict is missing field {key} (top-level keys: {_keys(data)})")
            ) from exc
        except (IndexError, TypeError, AttributeError, ValueError) as exc:
            raise MessageFormatError(
                _safe(
                    f"cannot read message dict ({type(exc).__name__}: {str(exc)[:200]}); "
                    f"top-level keys: {_keys(data)}"
                )
            ) from exc


MESSAGE_LIST_ADAPTER: TypeAdapter[list[Message]] = TypeAdapter(list[Message])
"""(De)serialises lists of messages: ``MESSAGE_LIST_ADAPTER.dump_json(msgs)``."""


# ---------------------------------------------------------------------- helpers
def _safe(text: str, limit: int = 2000) -> str:
    """An error message that any stream can print: UTF-8-encodable and bounded."""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _keys(data: Mapping[Any, Any]) -> str:
    """The keys of a dict for an error message: sorted by repr, bounded."""
    shown = sorted(_short(k) for k in itertools.islice(data, 50))
    more = f", ... ({len(data)} keys)" if len(data) > len(shown) else ""
    return "[" + ", ".join(shown) + more + "]"


def _errors(exc: ValidationError, limit: int = 3) -> str:
    """The first ``limit`` errors of a ValidationError, one ``loc: message`` each."""
    errors = exc.errors(include_url=False, include_context=False)
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or '(message)'}: {e['msg']} "
        f"(got {_short(e.get('input'))})"
        for e in errors[:limit]
    ]
    if len(errors) > limit:
        parts.append(f"... and {len(errors) - limit} more")
    return "; ".join(parts)


def content_text(content: Content) -> str:
    """A message content as plain text: parts joined by newlines, dicts as JSON, ``None``: "".

    Example:
        >>> content_text([TextPart(text="a"), TextPart(text="b")]).splitlines()
        ['a', 'b']
        >>> content_text(None), content_text({"k": 1})
        ('', '{"k": 1}')
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return json.dumps(content, ensure_ascii=False, sort_keys=True)
    return "\n".join(p.text for p in content if isinstance(p, TextPart))


def _image_urls(message: Message) -> list[str]:
    urls = list(message.images)
    if isinstance(message.content, list):
        urls.extend(p.url for p in message.content if isinstance(p, ImagePart))
    return urls


def _body_text(message: Message) -> str:
    """Text to send: content, then structured data / agent calls when there is no content."""
    text = message.text
    extra: list[str] = []
    if message.structured_data is not None and not text:
        extra.append(json.dumps(message.structured_data, ensure_ascii=False, sort_keys=True))
    for call in message.agent_calls:
        req = call.request if isinstance(call.request, str) else json.dumps(call.request)
        extra.append(f"[Call to {call.agent}]: {req}")
    if extra:
        text = "\n".join([text, *extra]) if text else "\n".join(extra)
    return text


def is_user_turn(message: Message) -> bool:
    """Whether a message opens a turn: a user message with something to send, or an agent call.

    What a context window with ``start_on="user"`` starts on. An ``agent_call`` is sent as a
    user message (``[Request from X]: ...``); a tool result, although Anthropic carries it in
    a user message, answers a call and opens nothing; an empty user message is not sent to
    Anthropic at all, so it opens nothing either.

    Example:
        >>> is_user_turn(Message.user("hi")), is_user_turn(Message.agent_call("go", name="lead"))
        (True, True)
        >>> is_user_turn(Message.tool("72F", tool_call_id="c1")), is_user_turn(Message.user(""))
        (False, False)
    """
    if message.role == "agent_call":
        return True
    return message.role == "user" and bool(_body_text(message) or _image_urls(message))


def provider_order(messages: Iterable[Message]) -> list[Message]:
    """``messages`` with each tool result moved to right after the message that called it.

    Every provider wants a call's results next to it (Anthropic: in the very next user
    turn; Chat Completions: the tool messages right after the assistant message; Responses:
    the output after the call), while a history may hold other messages in between (a pinned
    or system message, a user message sent while the tool ran). Results keep their order;
    the messages in between follow them; a result whose call is not in ``messages`` stays
    where it is. :func:`to_llm_format` sends Chat Completions and Anthropic messages in this
    order.

    Example:
        >>> call = ToolCall(id="c1", name="weather")
        >>> msgs = [Message.assistant("", tool_calls=[call]), Message.user("and Oslo?"),
        ...         Message.tool("72F", tool_call_id="c1")]
        >>> [m.role for m in provider_order(msgs)]
        ['assistant', 'tool', 'user']
    """
    items = list(messages)
    owner: dict[str, int] = {}  # call id -> position of the latest message that made it
    moved: dict[int, list[int]] = {}  # caller position -> results to place right after it
    late: set[int] = set()
    displaced = False
    for pos, m in enumerate(items):
        if m.role == "tool" and m.tool_call_id is not None:
            caller = owner.get(m.tool_call_id)
            if caller is not None:
                results = moved.setdefault(caller, [])
                displaced = displaced or pos != caller + len(results) + 1
                results.append(pos)
                late.add(pos)
        for call in m.tool_calls:
            owner[call.id] = pos
    if not displaced:
        return items
    out: list[Message] = []
    for pos, m in enumerate(items):
        if pos in late:
            continue
        out.append(m)
        out.extend(items[r] for r in moved.get(pos, ()))
    return out


# ---------------------------------------------------------------------- OpenAI out
def _openai_content(message: Message, text: str) -> str | list[dict[str, Any]]:
    urls = _image_urls(message)
    if not urls:
        return text
    parts: list[dict[str, Any]] = []
    if text:
        parts.append({"type": "text", "text": text})
    parts.extend({"type": "image_url", "image_url": {"url": u}} for u in urls)
    return parts


def _to_openai(message: Message) -> dict[str, Any]:
    role = message.role
    if role == "agent_call":
        text = f"[Request from {message.name}]: {_body_text(message)}"
        return {"role": "user", "content": _openai_content(message, text)}
    if role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.text}
    out: dict[str, Any] = {"role": "assistant" if role == "agent_response" else role}
    text = _body_text(message)
    if role in ("assistant", "agent_response") and message.tool_calls:
        out["content"] = text or None
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in message.tool_calls
        ]
    else:
        out["content"] = _openai_content(message, text)
    if message.name and role != "agent_response":
        out["name"] = message.name
    return out


# ---------------------------------------------------------------------- Anthropic out
def _anthropic_image(url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        header, data = url[5:].split(";base64,", 1)
        return {"type": "image", "source": {"type": "base64", "media_type": header, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _to_anthropic_blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    role = message.role
    if role == "tool":
        block = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id,
            "content": message.text,
        }
        return "user", [block]
    text = _body_text(message)
    if role == "agent_call":
        text = f"[Request from {message.name}]: {text}"
    blocks: list[dict[str, Any]] = []
    if text:
        blocks.append({"type": "text", "text": text})
    blocks.extend(_anthropic_image(u) for u in _image_urls(message))
    blocks.extend(
        {"type": "tool_use", "id": c.id, "name": c.name, "input": _thaw(c.arguments)}
        for c in message.tool_calls
    )
    return ("assistant" if role in ("assistant", "agent_response") else "user"), blocks


def _to_anthropic(messages: Iterable[Message]) -> dict[str, Any]:
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            system.append(message.text)
            continue
        role, blocks = _to_anthropic_blocks(message)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:  # Anthropic wants alternating roles: merge.
            merged = out[-1]["content"]
            if message.role == "tool":  # tool results come first in a user turn
                first = next(
                    (k for k, b in enumerate(merged) if b["type"] != "tool_result"), len(merged)
                )
                merged[first:first] = blocks
            else:
                merged.extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for entry in out:  # plain text stays a plain string, as people write it by hand
        blocks = entry["content"]
        if len(blocks) == 1 and blocks[0]["type"] == "text":
            entry["content"] = blocks[0]["text"]
    payload: dict[str, Any] = {"messages": out}
    if system:
        payload["system"] = "\n\n".join(system)
    return payload


@overload
def to_llm_format(
    messages: Iterable[Message], provider: Literal["openai"] = "openai"
) -> list[dict[str, Any]]: ...


@overload
def to_llm_format(
    messages: Iterable[Message], provider: Literal["anthropic"]
) -> dict[str, Any]: ...


@overload
def to_llm_format(
    messages: Iterable[Message], provider: Literal["responses"]
) -> list[dict[str, Any]]: ...


def to_llm_format(
    messages: Iterable[Message], provider: Provider = "openai"
) -> list[dict[str, Any]] | dict[str, Any]:
    """Convert messages to what a provider's chat API takes.

    ``openai`` gives a list of message dicts. ``anthropic`` gives
    ``{"system": str, "messages": [...]}``: system text in its own field, tool results as
    ``tool_result`` blocks in user messages, consecutive same-role messages merged.
    ``responses`` gives a list of OpenAI Responses API input items (``message``,
    ``function_call``, ``function_call_output``: see :mod:`marsys_mem.model.responses`).
    ``agent_call`` becomes a user message prefixed ``[Request from <caller>]:`` and
    ``agent_response`` an assistant message.

    In ``openai`` and ``anthropic`` form each tool result is sent right after the message that
    made its call (:func:`provider_order`), and in Anthropic form a user turn lists its
    ``tool_result`` blocks first, as those APIs require; ``responses`` keeps the order (an
    output only has to come after its call). What the messages are is not changed: a list
    that starts with an assistant message, or holds a call with no result, is sent as it is
    (a context window, with ``start_on="user"``, starts on a user turn).

    Raises:
        ValueError: an unknown provider.
    """
    if provider == "openai":
        return [_to_openai(m) for m in provider_order(messages)]
    if provider == "anthropic":
        return _to_anthropic(provider_order(messages))
    if provider == "responses":  # an output only has to come after its call: order kept
        return [i for m in messages for i in responses_from_chat(_to_openai(m), m.metadata)]
    raise ValueError(f"provider must be 'openai', 'anthropic' or 'responses', got {provider!r}")


# ---------------------------------------------------------------------- provider in
def _parts_from_openai(content: Sequence[Mapping[str, Any]]) -> list[TextPart | ImagePart]:
    parts: list[TextPart | ImagePart] = []
    for i, part in enumerate(content):
        kind = part.get("type")
        if kind == "text":
            parts.append(TextPart(text=part["text"]))
        elif kind == "image_url":
            image = part["image_url"]
            url = image["url"] if isinstance(image, Mapping) else image
            parts.append(ImagePart(url=url))
        else:
            raise MessageFormatError(
                f"content[{i}].type {_short(kind)} is not 'text' or 'image_url'"
            )
    return parts


def _tool_calls_from_openai(raw: Sequence[Mapping[str, Any]]) -> list[ToolCall]:
    calls = []
    for i, call in enumerate(raw):
        fn = call["function"]
        args = fn.get("arguments") or "{}"
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError as exc:
                raise MessageFormatError(
                    f"tool_calls[{i}].function.arguments is not valid JSON: {_short(args)}"
                ) from exc
        calls.append(ToolCall(id=call["id"], name=fn["name"], arguments=args))
    return calls


def _from_openai(msg: Mapping[str, Any], metadata: dict[str, Any]) -> Message:
    role = msg.get("role")
    if role not in _ROLES:
        raise MessageFormatError(f"role {_short(role)} is not one of {sorted(_ROLES)}")
    content = msg.get("content")
    if isinstance(content, list):
        content = _parts_from_openai(content)
    fields: dict[str, Any] = {"role": role, "content": content, "metadata": metadata}
    if msg.get("name"):
        fields["name"] = msg["name"]
    if msg.get("tool_calls"):
        fields["tool_calls"] = _tool_calls_from_openai(msg["tool_calls"])
    if role == "tool":
        fields["tool_call_id"] = msg.get("tool_call_id")
    return Message(**fields)


def _from_anthropic(msg: Mapping[str, Any], metadata: dict[str, Any]) -> Message:
    role = msg.get("role", "assistant")
    blocks = msg["content"]
    if isinstance(blocks, str):
        return Message(role=role, content=blocks, metadata=metadata)
    results = [b for b in blocks if b.get("type") == "tool_result"]
    if results:
        if len(blocks) != 1:
            raise MessageFormatError(
                "an Anthropic message with tool_result blocks must hold exactly one block "
                f"to become one Message; it has {len(blocks)}"
            )
        block = results[0]
        inner = block.get("content", "")
        if isinstance(inner, list):
            inner = "\n".join(b.get("text", "") for b in inner if b.get("type") == "text")
        if block.get("is_error"):
            metadata["is_error"] = True
        return Message.tool(inner, tool_call_id=block["tool_use_id"], metadata=metadata)
    texts: list[str] = []
    images: list[str] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(ToolCall(id=block["id"], name=block["name"], arguments=block["input"]))
        elif kind == "image":
            src = block["source"]
            if src.get("type") == "base64":
                images.append(f"data:{src['media_type']};base64,{src['data']}")
            else:
                images.append(src["url"])
        elif kind == "thinking":
            metadata.setdefault("thinking", []).append(block.get("thinking", ""))
        else:
            raise MessageFormatError(
                f"content[{i}].type {_short(kind)} is not a known Anthropic block"
            )
    return Message(
        role=role,
        content="\n".join(texts) if texts else None,
        tool_calls=calls,
        images=images,
        metadata=metadata,
    )


def _from_llm_dict(data: Mapping[str, Any]) -> Message:
    if is_responses_dict(data):
        return _from_openai(*chat_from_responses(data))
    metadata: dict[str, Any] = {}
    if "choices" in data:  # OpenAI chat completion response
        choices = data["choices"]
        if not choices:
            raise MessageFormatError("choices is empty")
        choice = choices[0]
        for key in ("id", "model", "usage"):
            if data.get(key) is not None:
                metadata[key] = data[key]
        if choice.get("finish_reason") is not None:
            metadata["finish_reason"] = choice["finish_reason"]
        return _from_openai(choice["message"], metadata)
    if "role" not in data and data.get("type") != "message":
        raise MessageFormatError(
            f"not a provider message: no 'role', 'choices' or type='message' (keys: {_keys(data)})"
        )
    content = data.get("content")
    is_anthropic = data.get("type") == "message" or (
        isinstance(content, list)
        and any(isinstance(b, Mapping) and b.get("type") in _ANTHROPIC_ONLY for b in content)
    )
    if is_anthropic:
        for key in ("id", "model", "usage", "stop_reason"):
            if data.get(key) is not None:
                metadata[key] = data[key]
        return _from_anthropic(data, metadata)
    return _from_openai(data, metadata)


_ANTHROPIC_ONLY = frozenset(("tool_use", "tool_result", "image", "thinking"))
