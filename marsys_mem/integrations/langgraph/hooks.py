"""A LangGraph ``pre_model_hook``: the agent's model sees a marsys-mem context window.

LangGraph's own trimming (``trim_messages``) counts on the caller to keep tool calls and
their results together; cut in the wrong place, the model gets a ``ToolMessage`` whose call
is gone and the provider rejects the request. :func:`marsys_context_hook` builds the window
with marsys-mem's :func:`~marsys_mem.context.build_context` instead, so:

* an ``AIMessage`` with ``tool_calls`` and its ``ToolMessage`` results are kept or dropped
  together, and the window never starts with an orphan ``ToolMessage``;
* system messages are always kept; ``tokens <= max_tokens`` by the policy's counter (or
  :class:`~marsys_mem.exceptions.ContextOverflowError` says by how much);
* with ``strategy="summarize"`` what falls out becomes one ``SystemMessage`` summary
  (the offline extractive summariser unless you pass one).

The messages the model receives are the graph's own objects (ids, ``tool_calls``,
``additional_kwargs``, ``response_metadata`` untouched): each LangChain message is mapped to a
marsys :class:`~marsys_mem.model.Message` (``AIMessage.tool_calls`` <->
:class:`~marsys_mem.model.ToolCall`, ``ToolMessage`` <-> a tool result) only to choose the
window, and the chosen ones are handed back as they were.

What the hook returns: ``{"llm_input_messages": [...]}`` (the state keeps the whole
history; the model gets the window) for ``sliding_window`` and ``summarize``. For
``trim_oldest`` (destructive by definition) it returns ``{"messages": [RemoveMessage(
REMOVE_ALL_MESSAGES), *window]}``, which replaces the history in the graph's state.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from marsys_mem.callables import is_async_callable
from marsys_mem.context.policy import ContextPolicy, ContextWindow, Summarizer
from marsys_mem.context.tokens import TokenCounter, get_counter
from marsys_mem.context.window import abuild_context, build_context
from marsys_mem.exceptions import MissingDependencyError
from marsys_mem.model.messages import Message, ToolCall

try:
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ChatMessage,
        RemoveMessage,
        SystemMessage,
        ToolMessage,
        convert_to_messages,
    )
    from langgraph.graph.message import REMOVE_ALL_MESSAGES
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError(
        f"marsys_context_hook needs LangGraph ({exc}): pip install 'marsys-mem[langgraph]'"
    ) from exc

__all__ = [
    "amarsys_context_hook",
    "from_langchain",
    "marsys_context_hook",
    "marsys_window",
]

Hook = Callable[[Any], dict[str, list[BaseMessage]]]
AsyncHook = Callable[[Any], Awaitable[dict[str, list[BaseMessage]]]]


def _text(content: str | list[str | dict[str, Any]]) -> str:
    """The text of a LangChain content (a string, or a list of blocks)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, Mapping) and isinstance(block.get("text"), str):
            parts.append(block["text"])
    return "\n".join(parts)


def _one(lc: BaseMessage, mid: str) -> Message:
    text = _text(lc.content)
    if isinstance(lc, SystemMessage):
        return Message.system(text, message_id=mid)
    if isinstance(lc, AIMessage):
        calls = [
            ToolCall(id=c["id"], name=c["name"], arguments=dict(c["args"]))
            for c in lc.tool_calls
            if c.get("id")
        ]
        return Message.assistant(text or None, message_id=mid, tool_calls=calls)
    if isinstance(lc, ToolMessage):
        return Message.tool(text, tool_call_id=lc.tool_call_id, name=lc.name, message_id=mid)
    if isinstance(lc, ChatMessage) and lc.role in ("system", "assistant", "ai"):
        if lc.role == "system":
            return Message.system(text, message_id=mid)
        return Message.assistant(text, message_id=mid)
    return Message.user(text, message_id=mid)  # HumanMessage and anything else


def from_langchain(messages: Sequence[Any]) -> list[Message]:
    """LangChain messages (or their dict / tuple forms) as marsys-mem messages, in order.

    ``AIMessage.tool_calls`` become :class:`~marsys_mem.model.ToolCall` s and a
    ``ToolMessage`` a tool result with its ``tool_call_id``; each message's ``message_id`` is
    its position (``"lc-0"``, ``"lc-1"``, ...), which :func:`marsys_window` maps back.

    Raises:
        ValueError: a message LangChain cannot read (its position named).

    Example:
        >>> from langchain_core.messages import HumanMessage
        >>> [m.role for m in from_langchain([HumanMessage("hi"), ("ai", "hello")])]
        ['user', 'assistant']
    """
    out: list[Message] = []
    for i, lc in enumerate(_as_langchain(messages)):
        out.append(_one(lc, f"lc-{i}"))
    return out


def _as_langchain(messages: Sequence[Any]) -> list[BaseMessage]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise ValueError(
            f"messages must be a list of LangChain messages, got {type(messages).__name__}"
        )
    out: list[BaseMessage] = []
    for i, m in enumerate(messages):
        if isinstance(m, BaseMessage):
            out.append(m)
            continue
        try:
            out.extend(convert_to_messages([m]))
        except (ValueError, TypeError, NotImplementedError) as exc:
            raise ValueError(f"messages[{i}] is not a LangChain message ({m!r}): {exc}") from exc
    return out


def _policy(policy: ContextPolicy | Mapping[str, Any]) -> ContextPolicy:
    if isinstance(policy, ContextPolicy):
        return policy
    if isinstance(policy, Mapping):
        return ContextPolicy.model_validate(dict(policy))
    raise TypeError(f"policy must be a ContextPolicy or a mapping, got {type(policy).__name__}")


def _messages_of(state: Any, key: str) -> Sequence[Any]:
    if isinstance(state, Mapping):
        if key not in state:
            raise KeyError(f"the graph state has no {key!r} (keys: {sorted(state)})")
        found: Sequence[Any] = state[key]
        return found
    if isinstance(state, Sequence) and not isinstance(state, str | bytes):
        return state  # a bare message list
    if hasattr(state, key):
        attr: Sequence[Any] = getattr(state, key)
        return attr
    raise KeyError(f"the graph state {type(state).__name__} has no {key!r}")


def _back(originals: list[BaseMessage], window: ContextWindow) -> list[BaseMessage]:
    """The window as the graph's own messages (the summary as a new SystemMessage)."""
    out: list[BaseMessage] = []
    for m in window.messages:
        if m.message_id.startswith("lc-"):
            out.append(originals[int(m.message_id[3:])])
        else:  # the summary the strategy made
            out.append(SystemMessage(m.text, id=m.message_id))
    return out


def _result(
    policy: ContextPolicy, originals: list[BaseMessage], window: ContextWindow, output_key: str
) -> dict[str, list[BaseMessage]]:
    kept = _back(originals, window)
    if policy.strategy == "trim_oldest":
        return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *kept]}
    return {output_key: kept}


def marsys_window(
    messages: Sequence[Any],
    policy: ContextPolicy | Mapping[str, Any],
    *,
    counter: TokenCounter | str | None = None,
    summarizer: Summarizer | None = None,
) -> list[BaseMessage]:
    """The context window of LangChain ``messages`` under ``policy``, as LangChain messages.

    The messages returned are the very objects passed in (plus a ``SystemMessage`` summary
    with ``strategy="summarize"``); use it wherever you call LangChain's ``trim_messages``.

    Raises:
        ContextOverflowError: what must be kept (system messages, the newest turn) does not
            fit the budget.

    Example:
        >>> from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
        >>> history = [
        ...     HumanMessage("weather?", id="1"),
        ...     AIMessage("", id="2", tool_calls=[{"id": "c1", "name": "w", "args": {}}]),
        ...     ToolMessage("72F", tool_call_id="c1", id="3"),
        ...     AIMessage("It is 72F.", id="4"),
        ... ]
        >>> [m.id for m in marsys_window(history, ContextPolicy(max_messages=4))]
        ['1', '2', '3', '4']
        >>> [m.id for m in marsys_window(history, ContextPolicy(max_messages=3, start_on="any"))]
        ['2', '3', '4']
    """
    pol = _policy(policy)
    originals = _as_langchain(messages)
    counted = get_counter(counter) if counter is not None else None
    window = build_context(from_langchain(originals), pol, counter=counted, summarizer=summarizer)
    return _back(originals, window)


def marsys_context_hook(
    policy: ContextPolicy | Mapping[str, Any],
    *,
    counter: TokenCounter | str | None = None,
    summarizer: Summarizer | None = None,
    messages_key: str = "messages",
    output_key: str = "llm_input_messages",
) -> Hook:
    """A ``pre_model_hook`` giving a LangGraph agent a marsys-mem context window.

    Args:
        policy: the :class:`~marsys_mem.context.ContextPolicy` (or its fields as a dict).
        counter: a token counter or its spec (``"heuristic"``, ``"tiktoken:o200k_base"``);
            default: the policy's ``token_counter``, else the heuristic.
        summarizer: for ``strategy="summarize"``: ``list[Message] -> str`` (sync; use
            :func:`amarsys_context_hook` for an async one).
        messages_key: the state key holding the history.
        output_key: the key the window is returned under (``llm_input_messages``: what
            ``create_react_agent`` sends the model without changing the state).

    Returns:
        ``hook(state) -> dict``; see the module docs for what it returns per strategy.

    Example:
        >>> from langchain_core.messages import HumanMessage
        >>> hook = marsys_context_hook(ContextPolicy(max_messages=2))
        >>> out = hook({"messages": [HumanMessage(f"m{i}", id=str(i)) for i in range(5)]})
        >>> [m.id for m in out["llm_input_messages"]]
        ['3', '4']

        In a graph: ``create_react_agent(model, tools, pre_model_hook=hook)``.
    """
    pol = _policy(policy)
    counted = get_counter(counter) if counter is not None else None
    _check_keys(messages_key, output_key)
    if summarizer is not None and is_async_callable(summarizer):
        raise ValueError("summarizer is async: use amarsys_context_hook")

    def hook(state: Any) -> dict[str, list[BaseMessage]]:
        originals = _as_langchain(_messages_of(state, messages_key))
        window = build_context(
            from_langchain(originals), pol, counter=counted, summarizer=summarizer
        )
        return _result(pol, originals, window, output_key)

    return hook


def amarsys_context_hook(
    policy: ContextPolicy | Mapping[str, Any],
    *,
    counter: TokenCounter | str | None = None,
    summarizer: Summarizer | None = None,
    messages_key: str = "messages",
    output_key: str = "llm_input_messages",
) -> AsyncHook:
    """Async twin of :func:`marsys_context_hook` (the summariser may be sync or async).

    Example:
        >>> import asyncio
        >>> from langchain_core.messages import HumanMessage
        >>> hook = amarsys_context_hook({"max_messages": 1})
        >>> state = {"messages": [HumanMessage("a", id="1"), HumanMessage("b", id="2")]}
        >>> out = asyncio.run(hook(state))
        >>> [m.id for m in out["llm_input_messages"]]
        ['2']
    """
    pol = _policy(policy)
    counted = get_counter(counter) if counter is not None else None
    _check_keys(messages_key, output_key)

    async def hook(state: Any) -> dict[str, list[BaseMessage]]:
        originals = _as_langchain(_messages_of(state, messages_key))
        window = await abuild_context(
            from_langchain(originals), pol, counter=counted, summarizer=summarizer
        )
        return _result(pol, originals, window, output_key)

    return hook


def _check_keys(messages_key: object, output_key: object) -> None:
    for name, value in (("messages_key", messages_key), ("output_key", output_key)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")
