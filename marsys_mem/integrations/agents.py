"""OpenAI Agents SDK: :class:`MarsysSession`, a ``Session`` over a marsys-mem agent memory.

Install with ``pip install 'marsys-mem[agents]'``. The SDK's ``Runner`` reads a session's
items before a run and adds the run's new items after each turn; ``MarsysSession`` keeps
them as messages of one :class:`~marsys_mem.manager.MemoryManager` agent, on the branch
named by the session id, so the manager's retention policy decides how long they live
(``persistent`` on SQLite: a new process sees them; ``session``: until ``end_session``;
``max_stored_messages`` and ``ttl`` enforced by the store).

Each SDK item becomes one :class:`~marsys_mem.model.messages.Message` (through
``Message.from_llm_dict``: a ``function_call`` is an assistant message with one tool call,
a ``function_call_output`` a tool message with its ``tool_call_id``), and the item itself
is kept in ``metadata["agents_item"]``, so ``get_items`` gives back exactly what was added.
A message item whose content ``from_llm_dict`` cannot read (a file input, say) is kept
as a message of its role with no content that holds only the item; a malformed
``function_call`` or ``function_call_output`` is refused (``MessageFormatError``).

``get_items(limit=N)`` never returns a ``function_call_output`` without its
``function_call``: where the newest ``N`` items would split a pair, it reaches back to the
call (so it may return more than ``N`` items), and with it the ``reasoning`` item just before
it. An output whose call is gone from the memory altogether (evicted by retention) is left
out, and so is a ``function_call`` whose output is not in the memory (``pop_item`` removed
it), with the ``reasoning`` item that led to it: a listing never holds half a pair. With
``policy=ContextPolicy(...)`` it returns the agent's context window under that policy
instead of the whole history: ``strategy="summarize"`` compacts older turns into one
summary (a system message), extended incrementally. ``close()`` ends the use of a session
(the SDK's sessions have one); the items stay in the manager's memory.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from pydantic import JsonValue, TypeAdapter, ValidationError

from marsys_mem.context.policy import ContextPolicy, Summarizer
from marsys_mem.conversation import ConversationMemory
from marsys_mem.exceptions import MessageFormatError, MissingDependencyError, StoreError
from marsys_mem.manager import MemoryManager
from marsys_mem.model.messages import Message, to_llm_format
from marsys_mem.model.names import validate_name

try:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from agents.memory.session_settings import coerce_session_settings, resolve_session_limit
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is installed in CI
    raise MissingDependencyError(
        "marsys_mem.integrations.agents needs the OpenAI Agents SDK: "
        "pip install 'marsys-mem[agents]'"
    ) from exc

__all__ = ["ITEM_KEY", "MarsysSession"]

ITEM_KEY: Final = "agents_item"
"""The metadata key under which a message keeps the SDK item it was made from."""

_ITEMS: TypeAdapter[list[dict[str, JsonValue]]] = TypeAdapter(list[dict[str, JsonValue]])
_LIMIT: TypeAdapter[int | None] = TypeAdapter(int | None)
_PLAIN_ROLES = frozenset(("user", "system", "assistant"))


def _plain(value: Any) -> Any:
    """A deep, mutable copy of a (frozen) JSON value."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _to_message(item: dict[str, JsonValue]) -> Message:
    """One SDK item as a message that keeps the item."""
    try:
        message = Message.from_llm_dict(item)
    except MessageFormatError:
        if item.get("type", "message") != "message":
            raise
        role = item.get("role")
        role = "system" if role == "developer" else role if role in _PLAIN_ROLES else "assistant"
        return Message(role=cast(Any, role), metadata={ITEM_KEY: item})
    return message.model_copy(update={"metadata": {**message.metadata, ITEM_KEY: item}})


def _item_type(message: Message) -> Any:
    item = message.metadata.get(ITEM_KEY)
    return item.get("type") if isinstance(item, Mapping) else None


def _to_items(messages: Sequence[Message]) -> list[TResponseInputItem]:
    """The SDK items of messages: the kept item, else the message in Responses format."""
    items: list[Any] = []
    for message in messages:
        kept = message.metadata.get(ITEM_KEY)
        if isinstance(kept, Mapping):
            items.append(_plain(kept))
        else:  # a summary, or a message another writer added to the agent's memory
            items.extend(to_llm_format([message], "responses"))
    return cast(list[TResponseInputItem], items)


def _paired(messages: Sequence[Message], start: int) -> list[Message]:
    """``messages[start:]`` reaching back to the calls its tool results answer.

    Results whose call is not in ``messages`` at all are left out, and so are calls with
    no result after them (with a ``reasoning`` item right before such a call); a
    ``reasoning`` item right before the first message (a call it led to) comes along.
    """
    start = max(0, min(start, len(messages)))
    wanted = {m.tool_call_id for m in messages[start:] if m.tool_call_id is not None}
    wanted -= {c.id for m in messages[start:] for c in m.tool_calls}
    pos = start
    while wanted and pos > 0:
        pos -= 1
        found = wanted.intersection(c.id for c in messages[pos].tool_calls)
        if found:
            wanted -= found
            start = pos
    if start > 0 and _item_type(messages[start - 1]) == "reasoning":
        start -= 1
    window = messages[start:]
    # a call whose output is not in the memory (popped, or not added yet) is left out with
    # the reasoning item that led to it, as the Responses API rejects both
    answered = {m.tool_call_id for m in window if m.tool_call_id is not None}
    unanswered = {
        i for i, m in enumerate(window) if any(c.id not in answered for c in m.tool_calls)
    }
    calls = {c.id for i, m in enumerate(window) if i not in unanswered for c in m.tool_calls}
    kept: list[Message] = []
    for i, m in enumerate(window):
        if i in unanswered:
            if kept and _item_type(kept[-1]) == "reasoning":
                kept.pop()
        elif m.tool_call_id is None or m.tool_call_id in calls:
            kept.append(m)
    return kept


class MarsysSession:
    """An OpenAI Agents SDK ``Session`` over a marsys-mem agent's conversation memory.

    Pass it to ``Runner.run(agent, input, session=...)``: the runner reads the history from
    it before the run and adds each turn's items after. The items live in
    ``manager.memory(agent, branch=session_id)``, under the agent's retention policy.

    Args:
        session_id: the conversation's id; the memory's branch (a marsys-mem name: no
            ``/ + # @`` or control characters).
        manager: the :class:`MemoryManager` whose policy keeps the items.
        agent: the marsys-mem agent whose memory holds them (default ``"assistant"``).
        policy: ``None`` (default): ``get_items`` returns the whole history (the newest
            ``limit``); a :class:`ContextPolicy`: it returns the context window under the
            policy (``strategy="summarize"`` compacts older turns into a summary).
        summarizer: the summariser for ``summarize`` (default: the memory's, offline).
        session_settings: the SDK's settings (``limit`` when ``get_items`` gets none), or
            their dict; ``None``: ``SessionSettings()``.
        strict_tools: refuse items that reuse a ``call_id`` already in the session, or a
            ``function_call_output`` that answers no call in it (``DuplicateToolCallError``,
            ``OrphanToolResultError``); ``False`` stores them as the SDK's own sessions do
            (scripted runs, servers that number their call ids): listings still pair each
            output with its call.

    Raises:
        InvalidNameError: ``session_id`` or ``agent`` is not a valid name (nothing changes).
        TypeError: ``manager`` or ``policy`` has the wrong type.

    Example:
        >>> import asyncio
        >>> manager = MemoryManager()
        >>> session = MarsysSession("user-42", manager)
        >>> call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
        >>> asyncio.run(session.add_items([
        ...     {"role": "user", "content": "Weather?"}, call,
        ...     {"type": "function_call_output", "call_id": "c1", "output": "72F"}]))
        >>> [i.get("type", "message") for i in asyncio.run(session.get_items(limit=1))]
        ['function_call', 'function_call_output']
        >>> manager.memory("assistant", branch="user-42")[-1].tool_call_id
        'c1'
        >>> session.close()  # the SDK's sessions have one; the manager stays open
        >>> manager.close()
    """

    session_settings: SessionSettings

    def __init__(
        self,
        session_id: str,
        manager: MemoryManager,
        *,
        agent: str = "assistant",
        policy: ContextPolicy | None = None,
        summarizer: Summarizer | None = None,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
        strict_tools: bool = True,
    ) -> None:
        if not isinstance(manager, MemoryManager):
            raise TypeError(f"manager must be a MemoryManager, got {type(manager).__name__}")
        if policy is not None and not isinstance(policy, ContextPolicy):
            raise TypeError(f"policy must be a ContextPolicy or None, got {type(policy).__name__}")
        self.session_id = validate_name("session_id", session_id)
        self.agent = validate_name("agent", agent)
        self.manager = manager
        self.policy = policy
        self.summarizer = summarizer
        self.session_settings = (  # as the SDK's sessions keep them
            SessionSettings()
            if session_settings is None
            else coerce_session_settings(cast(Any, session_settings))
        )
        self.strict_tools = bool(strict_tools)
        self._closed = False

    @property
    def memory(self) -> ConversationMemory:
        """The agent's memory on this session's branch (from the manager, on every use).

        Raises:
            StoreError: the session is closed.
        """
        self._check_open()
        return self.manager.memory(self.agent, branch=self.session_id)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def close(self) -> None:
        """End the use of this session (idempotent); its methods then raise ``StoreError``.

        The items stay in the manager's memory, under its retention policy, and the
        manager stays open: it belongs to the caller (``manager.close()`` flushes and
        closes it). A new ``MarsysSession`` with the same id reads them again.
        """
        self._closed = True

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history, oldest first: all of it, the newest ``limit`` items, or the window.

        A ``function_call_output`` always comes with its ``function_call`` (the result
        may then hold more than ``limit`` items): older items are only added in front of
        the newest ``limit``, which stay last (less any output whose call was evicted).

        Raises:
            ValueError: ``limit`` is not ``None`` or an int >= 0.
            StoreError: the session is closed.
        """
        self._check_open()
        limit = resolve_session_limit(_check_limit(limit), self.session_settings)
        memory = self.memory
        if self.policy is not None:
            window = await memory.acontext(self.policy, summarizer=self.summarizer)
            messages = list(window.messages)
            start = 0 if limit is None else len(messages) - limit
        else:
            with memory.lock:
                if limit is None:
                    messages, start = memory.read(), 0
                else:
                    messages, start = self._tail(memory, limit)
        return _to_items(_paired(messages, start))

    @staticmethod
    def _tail(memory: ConversationMemory, limit: int) -> tuple[list[Message], int]:
        """The newest ``limit`` messages and the calls they answer (lock held)."""
        size = len(memory)
        recent = memory.get_recent(limit)
        first = tail = size - len(recent)
        for message in recent:
            if message.tool_call_id is not None:
                owner = memory.call_owner(message.tool_call_id)
                if owner is not None:
                    first = min(first, owner)
        first = max(0, first - 1)  # the reasoning item that may precede the first call
        return memory.get_recent(size - first), tail - first

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append items, all or none (each becomes one message).

        Raises:
            ValueError: ``items`` is not a list of JSON objects (the error names the item).
            OrphanToolResultError: a ``function_call_output`` answers no call in the memory.
            DuplicateToolCallError: a ``call_id`` used twice.
            MessageFormatError: an item that is not valid JSON (NaN) or a malformed
                ``function_call`` / ``function_call_output``; the error names the item.
            StoreError: the session is closed.
        """
        self._check_open()
        try:
            checked = _ITEMS.validate_python(items)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = "items" + "".join(f"[{p!r}]" for p in first["loc"][:1])
            raise ValueError(
                f"items must be a list of JSON objects; {where}: {first['msg']}"
            ) from None
        messages: list[Message] = []
        for i, item in enumerate(checked):
            try:
                messages.append(_to_message(item))
            except (MessageFormatError, ValidationError) as exc:
                kind = item.get("type", "message")
                reason = (
                    exc.errors(include_url=False)[0]["msg"]
                    if isinstance(exc, ValidationError)
                    else str(exc)
                )
                raise MessageFormatError(f"items[{i}] ({kind!r}): {reason}") from exc
        if messages:
            await asyncio.to_thread(self._add, messages)

    def _add(self, messages: list[Message]) -> None:
        memory = self.memory
        if self.strict_tools:
            memory.add_many(messages)
            return
        with memory.lock:  # this session's rule, for this append only
            strict, memory.strict_tools = memory.strict_tools, False
            try:
                memory.add_many(messages)
            finally:
                memory.strict_tools = strict

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it (``None`` when the session is empty)."""
        self._check_open()

        def pop() -> Message | None:
            memory = self.memory
            with memory.lock:
                if not len(memory):
                    return None
                last = memory[-1]  # forgotten as every message is: memory, store, patterns
                self.manager.forget(self.agent, self.session_id, message_ids=[last.message_id])
                return last

        popped = await asyncio.to_thread(pop)
        return None if popped is None else _to_items([popped])[0]

    async def clear_session(self) -> None:
        """Delete every item of this session: memory, store and patterns (``forget``)."""
        self._check_open()
        await asyncio.to_thread(
            functools.partial(self.manager.forget, self.agent, self.session_id, everything=True)
        )

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"MarsysSession {self.session_id!r} is closed")

    def __repr__(self) -> str:
        mode = "history" if self.policy is None else f"window:{self.policy.strategy}"
        if self._closed:
            mode += ", closed"
        return f"MarsysSession({self.session_id!r}, agent={self.agent!r}, {mode})"


def _check_limit(limit: Any) -> int | None:
    if isinstance(limit, bool):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
    try:
        value = _LIMIT.validate_python(limit, strict=True)
    except ValidationError:
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}") from None
    if value is not None and value < 0:
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
    return value
