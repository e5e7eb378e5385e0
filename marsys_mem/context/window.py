"""Bounded context windows: what an agent sends to its LLM.

:func:`build_context` picks, from a conversation history, the messages that fit a
:class:`ContextPolicy`. Three strategies:

* ``sliding_window``: a view. The history stays whole; only the newest messages that fit
  are sent.
* ``trim_oldest``: the same window, but the messages that fall out are deleted from the
  memory (``ConversationMemory.context`` does the deleting).
* ``summarize``: what falls out of the window is replaced by one system message holding a
  summary. The summariser (any ``list[Message] -> str`` callable, sync or async) is called
  only for messages not summarised before: the previous summary comes first in its input,
  as a system message with ``metadata["summary"] = True``.

Invariants, for every strategy:

1. System and pinned messages are always kept (a pinned message keeps its tool-call group).
2. An assistant message with ``tool_calls`` and its tool results are kept or dropped together.
3. Tool results whose call is not in the window (orphans) are never sent, so the window never
   starts with one.
4. ``window.tokens <= max_tokens`` and ``len(window) <= max_messages`` by the policy's
   counter; both limits may be set and the stricter wins. If the messages that must be kept
   (protected ones, the newest turn, the summary reserve) do not fit,
   :class:`~marsys_mem.exceptions.ContextOverflowError` says by how much.

Cost: counts are cached per message, and the window is found walking back from the newest
message, so with an indexed history (``ConversationMemory``) a call costs O(window), not
O(history). A plain list is indexed on each call (O(history)).
"""

from __future__ import annotations

import bisect
import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from marsys_mem.context.tokens import TokenCounter, count_message, get_counter
from marsys_mem.exceptions import ContextOverflowError, SummarizerError
from marsys_mem.model.messages import Message, Provider, to_llm_format

__all__ = [
    "ContextPolicy",
    "ContextWindow",
    "Strategy",
    "Summarizer",
    "abuild_context",
    "build_context",
]

Strategy = Literal["sliding_window", "trim_oldest", "summarize"]
Summarizer = Callable[[list[Message]], "str | Awaitable[str]"]
"""A ``list[Message] -> str`` callable, sync or async."""


def _check_encoding_name(name: str) -> None:
    """Reject an encoding tiktoken does not know (when tiktoken is installed)."""
    try:
        import tiktoken
    except ImportError:
        return
    known = tiktoken.list_encoding_names()
    if name not in known:
        raise ValueError(f"unknown tiktoken encoding {name!r}; known: {', '.join(known)}")


class ContextPolicy(BaseModel):
    """How much of a history an agent may send, and what happens to the rest.

    Args:
        max_messages: most messages in the window (system, pinned and summary included).
        max_tokens: most tokens in the window, by the counter.
        strategy: ``sliding_window`` (view), ``trim_oldest`` (destructive) or ``summarize``.
        keep_recent: ``summarize`` only: most recent messages kept verbatim; older ones are
            summarised even when they would fit.
        summary_max_tokens: ``summarize`` only: tokens reserved for the summary message
            (default: a quarter of ``max_tokens``); a longer summary is cut to fit.
        token_counter: ``"heuristic"`` or ``"tiktoken[:encoding]"``; ``None`` uses the
            memory's counter.

    Example:
        >>> policy = ContextPolicy(max_messages=50, max_tokens=8000)
        >>> policy.strategy
        'sliding_window'
        >>> ContextPolicy(max_tokens=4000, strategy="summarize", keep_recent=20).keep_recent
        20
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_messages: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    strategy: Strategy = "sliding_window"
    keep_recent: int | None = Field(default=None, ge=0)
    summary_max_tokens: int | None = Field(default=None, ge=1)
    token_counter: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ContextPolicy:
        if self.strategy != "summarize":
            for name in ("keep_recent", "summary_max_tokens"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name} only applies to strategy 'summarize', not {self.strategy!r}"
                    )
        if (
            self.summary_max_tokens is not None
            and self.max_tokens is not None
            and self.summary_max_tokens >= self.max_tokens
        ):
            raise ValueError(
                f"summary_max_tokens ({self.summary_max_tokens}) must be less than "
                f"max_tokens ({self.max_tokens})"
            )
        return self

    @field_validator("token_counter")
    @classmethod
    def _check_counter_name(cls, value: str | None) -> str | None:
        if value is None or value in ("heuristic", "tiktoken"):
            return value
        if value.startswith("tiktoken:") and len(value) > len("tiktoken:"):
            _check_encoding_name(value.split(":", 1)[1])
            return value  # the encoding itself is loaded when the counter is first used
        raise ValueError(
            f"unknown token counter {value!r}; use 'heuristic', 'tiktoken' or 'tiktoken:<encoding>'"
        )

    @property
    def summary_reserve(self) -> int | None:
        """Tokens reserved for the summary (``None``: unbounded)."""
        if self.summary_max_tokens is not None:
            return self.summary_max_tokens
        if self.max_tokens is not None:
            return max(1, self.max_tokens // 4)
        return None


@dataclass(frozen=True, slots=True)
class ContextWindow:
    """The messages an agent would send, and what it cost.

    Attributes:
        messages: the window, oldest first (summary included, where it sits).
        tokens: tokens of ``messages`` by the policy's counter.
        dropped: history messages not in the window.
        summary: the summary message, if the strategy produced one.
        strategy: the strategy used.
        history_messages: messages in the whole history.
        history_tokens: tokens of the whole history.
        summarized: messages newly passed to the summariser by this call.

    Example:
        >>> from marsys_mem import ConversationMemory, Message
        >>> mem = ConversationMemory([Message.system("Be terse."), Message.user("Hi")])
        >>> win = mem.context(ContextPolicy(max_messages=2))
        >>> len(win), win.dropped
        (2, 0)
    """

    messages: tuple[Message, ...]
    tokens: int
    dropped: int
    summary: Message | None
    strategy: Strategy
    history_messages: int
    history_tokens: int
    summarized: int = 0
    dropped_ids: tuple[str, ...] = field(default=(), repr=False)

    @property
    def tokens_saved(self) -> int:
        """History tokens minus window tokens (negative if a summary costs more)."""
        return self.history_tokens - self.tokens

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Any:
        return iter(self.messages)

    def to_llm_format(self, provider: Provider = "openai") -> Any:
        """The window in a provider's format (see :func:`~marsys_mem.model.to_llm_format`)."""
        return to_llm_format(self.messages, provider)

    def _repr_html_(self) -> str:
        from marsys_mem.display import window_html

        return window_html(self)

    def __repr__(self) -> str:
        summary = ", summary=True" if self.summary is not None else ""
        return (
            f"ContextWindow(strategy={self.strategy!r}, messages={len(self.messages)}, "
            f"tokens={self.tokens}, dropped={self.dropped}, history_messages="
            f"{self.history_messages}, history_tokens={self.history_tokens}{summary})"
        )


# ---------------------------------------------------------------------- history index
class _HistoryIndex(Protocol):
    """What the window builder needs from a history: positions and tool-call links."""

    def __len__(self) -> int: ...

    def __getitem__(self, position: int) -> Message: ...

    def protected_positions(self) -> list[int]: ...

    def call_owner(self, call_id: str, before: int | None = None) -> int | None: ...

    def call_results(self, call_id: str) -> list[int]: ...


class _ListIndex:
    """Index of a plain list of messages, built by one scan."""

    def __init__(self, messages: Sequence[Message]) -> None:
        self._messages = messages
        self._protected: list[int] = []
        self._owners: dict[str, list[int]] = {}
        self._results: dict[str, list[int]] = {}
        for pos, m in enumerate(messages):
            if m.is_protected:
                self._protected.append(pos)
            for call in m.tool_calls:
                self._owners.setdefault(call.id, []).append(pos)
            if m.tool_call_id is not None:
                self._results.setdefault(m.tool_call_id, []).append(pos)

    def __len__(self) -> int:
        return len(self._messages)

    def __getitem__(self, position: int) -> Message:
        return self._messages[position]

    def protected_positions(self) -> list[int]:
        return self._protected

    def call_owner(self, call_id: str, before: int | None = None) -> int | None:
        return _latest_before(self._owners.get(call_id), before)

    def call_results(self, call_id: str) -> list[int]:
        return self._results.get(call_id, [])


def _latest_before(positions: Sequence[int] | None, before: int | None) -> int | None:
    """The largest position ``< before`` (or the largest at all), from an ascending list."""
    if not positions:
        return None
    if before is None:
        return positions[-1]
    i = bisect.bisect_left(positions, before)
    return positions[i - 1] if i else None


def _owner(ix: _HistoryIndex, pos: int, m: Message) -> int | None:
    """Position of the call a tool result at ``pos`` answers: the latest one before it."""
    return ix.call_owner(m.tool_call_id, before=pos)  # type: ignore[arg-type]


def _is_orphan(ix: _HistoryIndex, pos: int, m: Message) -> bool:
    return m.role == "tool" and _owner(ix, pos, m) is None


def _results_of(ix: _HistoryIndex, pos: int, m: Message) -> list[int]:
    """Positions of the tool results answering the calls of the message at ``pos``."""
    out: list[int] = []
    for call in m.tool_calls:
        out.extend(r for r in ix.call_results(call.id) if ix.call_owner(call.id, before=r) == pos)
    return out


def _linked(ix: _HistoryIndex, pos: int) -> set[int] | None:
    """``pos`` and every call/result linked to it, transitively; ``None`` for an orphan."""
    m = ix[pos]
    if _is_orphan(ix, pos, m):
        return None
    group = {pos}
    todo = [pos]
    while todo:
        k = todo.pop()
        msg = ix[k]
        linked = _results_of(ix, k, msg) if msg.tool_calls else []
        if msg.role == "tool":
            owner = _owner(ix, k, msg)
            if owner is not None:
                linked.append(owner)
        for other in linked:
            if other not in group:
                group.add(other)
                todo.append(other)
    return group


def _unit(ix: _HistoryIndex, pos: int) -> tuple[int, int] | None:
    """The smallest contiguous range holding ``pos`` and every call/result linked to it.

    ``None`` for an orphan tool result.
    """
    m = ix[pos]
    if m.role == "tool":
        if _is_orphan(ix, pos, m):
            return None
    elif not m.tool_calls:
        return pos, pos
    start = end = pos
    changed = True
    while changed:
        changed = False
        for k in range(start, end + 1):
            msg = ix[k]
            if msg.role == "tool":
                owner = _owner(ix, k, msg)
                if owner is not None and owner < start:
                    start, changed = owner, True
            if msg.tool_calls:
                for r in _results_of(ix, k, msg):
                    if r > end:
                        end, changed = r, True
    return start, end


@dataclass(slots=True)
class _Plan:
    positions: list[int]  # window positions, ascending (protected + retained suffix)
    tokens: int
    cut: int  # first position of the retained suffix (len(history) if none retained)
    protected: set[int]


def _overflow(what: str, required: int, limit: int, unit: str) -> ContextOverflowError:
    return ContextOverflowError(
        f"{what} need {required} {unit} but the limit is {limit} (over by {required - limit})",
        required=required,
        limit=limit,
        unit=unit,
    )


def _plan(
    ix: _HistoryIndex,
    policy: ContextPolicy,
    counter: TokenCounter,
    *,
    reserve_tokens: int = 0,
    reserve_messages: int = 0,
    keep_recent: int | None = None,
) -> _Plan:
    protected: set[int] = set()
    for p in ix.protected_positions():
        if p not in protected:
            protected.update(_linked(ix, p) or ())  # the linked group, not the range
    prot_tokens = sum(count_message(counter, ix[k]) for k in protected)
    max_tokens, max_messages = policy.max_tokens, policy.max_messages
    what = "system and pinned messages" + (" plus the summary reserve" if reserve_messages else "")
    if max_tokens is not None and prot_tokens + reserve_tokens > max_tokens:
        raise _overflow(what, prot_tokens + reserve_tokens, max_tokens, "tokens")
    if max_messages is not None and len(protected) + reserve_messages > max_messages:
        raise _overflow(what, len(protected) + reserve_messages, max_messages, "messages")
    tokens_left = math.inf if max_tokens is None else max_tokens - prot_tokens - reserve_tokens
    messages_left = (
        math.inf if max_messages is None else max_messages - len(protected) - reserve_messages
    )
    recent_left = math.inf if keep_recent is None else keep_recent

    retained: list[int] = []
    tokens = prot_tokens
    cut = n = len(ix)
    j = n - 1
    newest = True
    while j >= 0:
        if j in protected:
            j -= 1
            continue
        unit = _unit(ix, j)
        if unit is None:  # orphan tool result: never sent
            j -= 1
            continue
        start, end = unit
        members = [
            k for k in range(start, end + 1) if k not in protected and not _is_orphan(ix, k, ix[k])
        ]
        unit_tokens = sum(count_message(counter, ix[k]) for k in members)
        if unit_tokens > tokens_left or len(members) > messages_left:
            if newest:
                used_t = prot_tokens + reserve_tokens + unit_tokens
                if max_tokens is not None and used_t > max_tokens:
                    raise _overflow(
                        f"the newest turn ({len(members)} messages) with {what}",
                        used_t,
                        max_tokens,
                        "tokens",
                    )
                used_m = len(protected) + reserve_messages + len(members)
                assert max_messages is not None
                raise _overflow(f"the newest turn with {what}", used_m, max_messages, "messages")
            break
        if len(members) > recent_left:
            break
        retained.extend(members)
        tokens += unit_tokens
        tokens_left -= unit_tokens
        messages_left -= len(members)
        recent_left -= len(members)
        newest = False
        cut = start
        j = start - 1
    positions = sorted(protected.union(retained))
    return _Plan(positions=positions, tokens=tokens, cut=cut, protected=protected)


# ---------------------------------------------------------------------- summaries
@dataclass(slots=True)
class _SummaryState:
    """A cached summary of every unprotected message before position ``covered``."""

    text: str
    covered: int  # positions [0, covered) are summarised
    last_id: str | None  # id of the message at covered - 1, to detect edits
    count: int  # messages summarised


SUMMARY_NAME = "summary"


def _summary_message(text: str, state: _SummaryState) -> Message:
    return Message.system(
        text,
        name=SUMMARY_NAME,
        metadata={"summary": True, "covers": state.count, "through": state.last_id},
    )


def _fit_text(text: str, limit: int | None, counter: TokenCounter) -> str:
    """Cut ``text`` so a summary message holding it costs at most ``limit`` tokens."""
    if limit is None:
        return text
    probe = Message.system(text, name=SUMMARY_NAME)
    if counter.count(probe) <= limit:
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # largest prefix that fits, with an ellipsis
        mid = (lo + hi + 1) // 2
        cand = text[:mid].rstrip() + " …"
        if counter.count(Message.system(cand, name=SUMMARY_NAME)) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo].rstrip() + " …" if lo else ""


@dataclass(slots=True)
class _Prepared:
    plan: _Plan
    request: list[Message] | None  # what to pass to the summariser, if anything
    new_state: _SummaryState | None  # state once the summariser answers (text filled later)
    summary_needed: bool
    newly: int


def _drops_unprotected(ix: _HistoryIndex, plan: _Plan) -> bool:
    """True if an unprotected, sendable message lies before the retained suffix."""
    for k in range(plan.cut - 1, -1, -1):  # usually stops at the first step
        if k not in plan.protected and not _is_orphan(ix, k, ix[k]):
            return True
    return False


def _prepare(
    ix: _HistoryIndex,
    policy: ContextPolicy,
    counter: TokenCounter,
    state: _SummaryState | None,
) -> _Prepared:
    if policy.strategy != "summarize":
        return _Prepared(_plan(ix, policy, counter), None, None, False, 0)
    first = _plan(ix, policy, counter, keep_recent=policy.keep_recent)
    if not _drops_unprotected(ix, first):
        return _Prepared(first, None, None, False, 0)
    reserve = policy.summary_reserve
    plan = _plan(
        ix,
        policy,
        counter,
        reserve_tokens=reserve or 0,
        reserve_messages=1,
        keep_recent=policy.keep_recent,
    )
    if state is not None and (
        state.covered > len(ix)
        or (state.covered > 0 and ix[state.covered - 1].message_id != state.last_id)
    ):
        state = None  # the history changed under the summary: start again
    start = state.covered if state is not None else 0
    new = [
        ix[k]
        for k in range(start, plan.cut)
        if k not in plan.protected and not _is_orphan(ix, k, ix[k])
    ]
    if not new:
        return _Prepared(plan, None, state, True, 0)
    request = list(new)
    if state is not None:
        request.insert(0, _summary_message(state.text, state))
    new_state = _SummaryState(
        text="",
        covered=plan.cut,
        last_id=ix[plan.cut - 1].message_id,
        count=(state.count if state else 0) + len(new),
    )
    return _Prepared(plan, request, new_state, True, len(new))


def _finish(
    ix: _HistoryIndex,
    policy: ContextPolicy,
    counter: TokenCounter,
    prep: _Prepared,
    text: Any,
    history_tokens: int,
) -> ContextWindow:
    plan = prep.plan
    summary: Message | None = None
    tokens = plan.tokens
    state = prep.new_state
    if prep.request is not None:
        if not isinstance(text, str):
            raise SummarizerError(f"the summariser returned {type(text).__name__}, not str")
        assert state is not None
        state.text = text
    if prep.summary_needed and state is not None and state.text:
        fitted = _fit_text(state.text, policy.summary_reserve, counter)
        if fitted:
            summary = _summary_message(fitted, state)
            tokens += count_message(counter, summary)
    messages: list[Message] = []
    placed = summary is None
    for pos in plan.positions:
        if not placed and pos >= plan.cut:
            messages.append(summary)  # type: ignore[arg-type]
            placed = True
        messages.append(ix[pos])
    if not placed:
        messages.append(summary)  # type: ignore[arg-type]
    return ContextWindow(
        messages=tuple(messages),
        tokens=tokens,
        dropped=len(ix) - len(plan.positions),
        summary=summary,
        strategy=policy.strategy,
        history_messages=len(ix),
        history_tokens=history_tokens,
        summarized=prep.newly,
    )


def _call_sync(summarizer: Summarizer, request: list[Message]) -> Any:
    try:
        result = summarizer(request)
    except Exception as exc:
        raise SummarizerError(f"the summariser raised {type(exc).__name__}: {exc}") from exc
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise SummarizerError("the summariser is async: use acontext() / abuild_context() instead")
    return result


async def _call_async(summarizer: Summarizer, request: list[Message]) -> Any:
    try:
        result = summarizer(request)
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:
        raise SummarizerError(f"the summariser raised {type(exc).__name__}: {exc}") from exc
    return result


def _resolve(
    messages: Sequence[Message] | _HistoryIndex,
    policy: ContextPolicy | None,
    counter: TokenCounter | None,
) -> tuple[_HistoryIndex, ContextPolicy, TokenCounter]:
    policy = policy or ContextPolicy()
    if counter is None:
        counter = get_counter(policy.token_counter)
    ix: _HistoryIndex
    if hasattr(messages, "call_owner"):
        ix = messages  # type: ignore[assignment]
    else:
        ix = _ListIndex(messages)
    return ix, policy, counter


def _history_tokens(ix: _HistoryIndex, counter: TokenCounter, known: int | None) -> int:
    if known is not None:
        return known
    return sum(count_message(counter, ix[k]) for k in range(len(ix)))


def _default_summarizer() -> Summarizer:
    from marsys_mem.context.summarize import ExtractiveSummarizer

    return ExtractiveSummarizer()


def _build(
    messages: Sequence[Message] | _HistoryIndex,
    policy: ContextPolicy | None,
    counter: TokenCounter | None,
    summarizer: Summarizer | None,
    state: _SummaryState | None,
    history_tokens: int | None,
) -> tuple[ContextWindow, _SummaryState | None, _Prepared]:
    ix, policy, counter = _resolve(messages, policy, counter)
    prep = _prepare(ix, policy, counter, state)
    text = None
    if prep.request is not None:
        text = _call_sync(summarizer or _default_summarizer(), prep.request)
    win = _finish(ix, policy, counter, prep, text, _history_tokens(ix, counter, history_tokens))
    return win, prep.new_state, prep


async def _abuild(
    messages: Sequence[Message] | _HistoryIndex,
    policy: ContextPolicy | None,
    counter: TokenCounter | None,
    summarizer: Summarizer | None,
    state: _SummaryState | None,
    history_tokens: int | None,
) -> tuple[ContextWindow, _SummaryState | None, _Prepared]:
    ix, policy, counter = _resolve(messages, policy, counter)
    prep = _prepare(ix, policy, counter, state)
    text = None
    if prep.request is not None:
        text = await _call_async(summarizer or _default_summarizer(), prep.request)
    win = _finish(ix, policy, counter, prep, text, _history_tokens(ix, counter, history_tokens))
    return win, prep.new_state, prep


def build_context(
    messages: Sequence[Message],
    policy: ContextPolicy | None = None,
    *,
    counter: TokenCounter | None = None,
    summarizer: Summarizer | None = None,
) -> ContextWindow:
    """Build the context window of ``messages`` under ``policy``.

    A pure function: nothing is deleted or cached (``trim_oldest`` behaves like
    ``sliding_window`` here; ``ConversationMemory.context`` applies the deletion and caches
    summaries). With ``summarize`` and no ``summarizer``, the offline
    :class:`~marsys_mem.context.summarize.ExtractiveSummarizer` is used.

    Raises:
        ContextOverflowError: what must be kept does not fit; the error has the numbers.
        SummarizerError: the summariser failed or is async (use :func:`abuild_context`).

    Example:
        >>> msgs = [Message.system("Be terse.")] + [Message.user(f"q{i}") for i in range(10)]
        >>> win = build_context(msgs, ContextPolicy(max_messages=3))
        >>> [m.text for m in win.messages]
        ['Be terse.', 'q8', 'q9']
    """
    return _build(messages, policy, counter, summarizer, None, None)[0]


async def abuild_context(
    messages: Sequence[Message],
    policy: ContextPolicy | None = None,
    *,
    counter: TokenCounter | None = None,
    summarizer: Summarizer | None = None,
) -> ContextWindow:
    """Async twin of :func:`build_context`; the summariser may be sync or async."""
    return (await _abuild(messages, policy, counter, summarizer, None, None))[0]
