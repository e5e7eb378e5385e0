"""HTML views for Jupyter: conversation memories, context windows, branch graphs, reports.

A low layer: it imports only the data model, and renders HTML from plain data. The objects
it shows sit above it and come to it, not the other way round:

* :class:`HtmlViewable` is the protocol: an object with a ``__html_view__(*, max_rows,
  max_chars)`` method has its own view (in the spirit of IPython's ``_repr_html_`` and
  rich's ``__rich__``). ``ConversationMemory``, ``ContextWindow`` and ``BranchGraph``
  implement it (their ``_repr_html_`` calls it, so a notebook cell that ends with one shows
  a table), and :func:`report_html` uses it for nested values.
* Each view reads a small documented shape: :class:`WindowSource` and :class:`GraphSource`
  are protocols of public attributes, and a memory hands over a :class:`MemoryView`
  (its messages, counts and a token-count callable).

Every view is *bounded*: long histories show the first and last rows with a "… N more" row
between them, and long texts are cut, so displaying a million-message memory costs the same
as displaying a short one. Every piece of user content is HTML-escaped.

Example:
    >>> from marsys_mem import ConversationMemory, Message
    >>> mem = ConversationMemory([Message.user("<b>hi</b>")])
    >>> html = memory_html(mem)
    >>> "&lt;b&gt;hi&lt;/b&gt;" in html and "<b>hi</b>" not in html
    True
"""

from __future__ import annotations

import dataclasses
import enum
import html
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import date, datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from marsys_mem.model.messages import Message

__all__ = [
    "MAX_CHARS",
    "MAX_ROWS",
    "GraphSource",
    "HtmlViewable",
    "IndexedMessages",
    "MemoryView",
    "WindowSource",
    "graph_html",
    "memory_html",
    "message_html",
    "report_html",
    "window_html",
]

MAX_ROWS = 20
"""Default most rows in a table (the first and last halves are shown)."""
MAX_CHARS = 300
"""Default most characters of one text shown (longer texts end with "…")."""

_MAX_DEPTH = 6
_FONT = "font-family: ui-sans-serif, system-ui, sans-serif; font-size: 12px; line-height: 1.4;"
_BOX = f"{_FONT} border: 1px solid rgba(127,127,127,.35); border-radius: 6px; padding: 6px 8px;"
_TABLE = "border-collapse: collapse; margin-top: 4px; width: 100%;"
_TH = (
    "text-align: left; padding: 2px 6px; border-bottom: 1px solid rgba(127,127,127,.45);"
    " font-weight: 600;"
)
_TD = "text-align: left; vertical-align: top; padding: 2px 6px;"
_TEXT = _TD + " white-space: pre-wrap; word-break: break-word;"
_MUTED = "opacity: .65;"
_ROLE_COLORS = {
    "system": "#7f7f7f",
    "user": "#1f77b4",
    "assistant": "#2ca02c",
    "tool": "#ff7f0e",
    "agent_call": "#9467bd",
    "agent_response": "#9467bd",
    "summary": "#17becf",
}
_STATUS_COLORS = {"active": "#4C9BE8", "merged": "#8BC34A", "closed": "#B0B0B0"}


# ---------------------------------------------------------------------- the protocol
@runtime_checkable
class HtmlViewable(Protocol):
    """An object with its own bounded HTML view: what this module dispatches on.

    ``__html_view__`` returns the object's view, at most ``max_rows`` rows per table and
    ``max_chars`` characters per text, with every piece of user content escaped (build it
    with this module's functions). :func:`report_html` shows a nested value that has one
    with it; a class's ``_repr_html_`` usually returns ``self.__html_view__()`` with the
    defaults :data:`MAX_ROWS` and :data:`MAX_CHARS`.

    Example:
        >>> class Note:
        ...     def __html_view__(self, *, max_rows: int, max_chars: int) -> str:
        ...         return "<i>a note</i>"
        >>> isinstance(Note(), HtmlViewable), "<i>a note</i>" in report_html({"n": Note()})
        (True, True)
    """

    def __html_view__(self, *, max_rows: int, max_chars: int) -> str:
        """The object as bounded, escaped HTML."""
        ...


class IndexedMessages(Protocol):
    """Random access to messages: a list, a tuple, or a memory's history without a copy.

    Example:
        >>> rows: IndexedMessages = [Message.user("hi")]
        >>> len(rows), rows[0].text
        (1, 'hi')
    """

    def __len__(self) -> int:
        """How many messages."""
        ...

    def __getitem__(self, position: int, /) -> Message:
        """The message at ``position`` (0 is the oldest)."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryView:
    """What :func:`memory_html` shows of a conversation memory: plain data it hands over.

    Attributes:
        messages: the history, oldest first; only the rows shown are read.
        agent: the memory's agent, if any.
        appended: how many of ``messages`` were added after construction (or the fork).
        tokens: tokens of the whole history.
        policy: the default context policy (its ``strategy`` and limits are shown).
        count: tokens of one message, for the tokens column (``None``: no column).
        title: the view's title.

    Example:
        >>> view = MemoryView([Message.user("hi")], agent="planner", appended=1, tokens=5)
        >>> html = memory_html(view)
        >>> "agent <code>planner</code>" in html, "1 messages (1 appended)" in html
        (True, True)
    """

    messages: IndexedMessages
    agent: str | None = None
    appended: int = 0
    tokens: int = 0
    policy: object | None = None
    count: Callable[[Message], int] | None = None
    title: str = "ConversationMemory"


class WindowSource(Protocol):
    """What :func:`window_html` reads: the public fields of a ``ContextWindow``."""

    @property
    def messages(self) -> Sequence[Message]:
        """The window, oldest first."""
        ...

    @property
    def tokens(self) -> int:
        """Tokens of the window."""
        ...

    @property
    def dropped(self) -> int:
        """History messages not in the window."""
        ...

    @property
    def summary(self) -> Message | None:
        """The summary message, if any."""
        ...

    @property
    def strategy(self) -> str:
        """The strategy that built the window."""
        ...

    @property
    def history_messages(self) -> int:
        """Messages in the whole history."""
        ...

    @property
    def history_tokens(self) -> int:
        """Tokens of the whole history."""
        ...

    @property
    def summarized(self) -> int:
        """Messages newly summarised by the call that built the window."""
        ...

    @property
    def tokens_saved(self) -> int:
        """History tokens minus window tokens."""
        ...


class GraphSource(Protocol):
    """What :func:`graph_html` reads: the public structure of a ``BranchGraph``."""

    def roots(self) -> Sequence[str]:
        """Branches that were added, not forked."""
        ...

    def children(self, branch: str) -> Sequence[str]:
        """The branches forked from ``branch``, in creation order."""
        ...

    def merges(self) -> Sequence[tuple[str, str]]:
        """``(child, into)`` of every merge."""
        ...

    def status(self, branch: str) -> str:
        """``active``, ``merged`` or ``closed``."""
        ...

    def agents(self, branch: str) -> Sequence[str]:
        """The agents of ``branch``."""
        ...


# ---------------------------------------------------------------------- helpers
def _e(value: object) -> str:
    """``str(value)``, HTML-escaped (quotes too)."""
    return html.escape(str(value), quote=True)


def _cut(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters (with "…"), then escaped."""
    if len(text) > max_chars:
        text = text[: max(0, max_chars - 1)] + "…"
    return _e(text)


def _check_limits(max_rows: int, max_chars: int) -> None:
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows must be an int >= 1, got {max_rows!r}")
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise ValueError(f"max_chars must be an int >= 1, got {max_chars!r}")


def _split(total: int, max_rows: int) -> tuple[range, int, range]:
    """Positions to show: the first rows, how many are hidden, the last rows."""
    if total <= max_rows:
        return range(total), 0, range(0)
    head = max_rows // 2
    tail = max_rows - head
    return range(head), total - max_rows, range(total - tail, total)


def _badge(label: str, color: str) -> str:
    return (
        f'<span style="background: {color}; color: #fff; border-radius: 3px; '
        f'padding: 0 5px; font-size: 11px; white-space: nowrap;">{_e(label)}</span>'
    )


def _more_row(hidden: int, columns: int, noun: str) -> str:
    return (
        f'<tr><td colspan="{columns}" style="{_TD} {_MUTED} text-align: center;">'
        f"… {hidden:,} more {_e(noun)} …</td></tr>"
    )


def _box(title: str, summary: str, body: str) -> str:
    return (
        f'<div class="marsys-mem" style="{_BOX}">'
        f"<div><b>{_e(title)}</b> <span>{summary}</span></div>{body}</div>"
    )


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):  # pragma: no cover - default=str handles the rest
        return str(value)


def _is_summary(message: Message, summary: Message | None) -> bool:
    if summary is not None and message.message_id == summary.message_id:
        return True
    return message.role == "system" and message.metadata.get("summary") is True


# ---------------------------------------------------------------------- messages
def _message_body(message: Message, max_chars: int) -> str:
    """The message's text plus its tool calls, tool call id, agent calls and images."""
    parts: list[str] = []
    text = message.text
    if not text and message.structured_data is not None:
        text = _json(message.structured_data)
    if text:
        parts.append(_cut(text, max_chars))
    for call in message.tool_calls:
        args = _cut(_json(call.arguments), max_chars)
        parts.append(
            f"<code>{_e(call.name)}({args})</code> <span style='{_MUTED}'>[{_e(call.id)}]</span>"
        )
    for agent_call in message.agent_calls:
        request = agent_call.request
        req = request if isinstance(request, str) else _json(request)
        parts.append(f"→ <b>{_e(agent_call.agent)}</b>: {_cut(req, max_chars)}")
    if message.tool_call_id is not None:
        parts.append(f"<span style='{_MUTED}'>result of [{_e(message.tool_call_id)}]</span>")
    images = len(message.images)
    if isinstance(message.content, list):
        images += sum(1 for p in message.content if getattr(p, "type", None) == "image")
    if images:
        parts.append(f"<span style='{_MUTED}'>[{images} image{'s' if images > 1 else ''}]</span>")
    return "<br>".join(parts) if parts else f"<span style='{_MUTED}'>(empty)</span>"


def _role_cell(message: Message, *, summary: bool = False) -> str:
    role = "summary" if summary else message.role
    cell = _badge(role, _ROLE_COLORS.get(role, "#7f7f7f"))
    if message.name and message.name != role:
        cell += f" <span style='{_MUTED}'>{_e(message.name)}</span>"
    if message.is_protected and message.role != "system":
        cell += " 📌"
    return cell


def message_html(message: Message, *, max_chars: int = MAX_CHARS) -> str:
    """One message as an inline snippet: role badge, name, text, tool and agent calls.

    Example:
        >>> "&lt;script&gt;" in message_html(Message.user("<script>alert(1)</script>"))
        True
    """
    _check_limits(1, max_chars)
    return f"{_role_cell(message)} {_message_body(message, max_chars)}"


def _message_rows(
    messages: IndexedMessages,
    *,
    count: Callable[[Message], int] | None,
    summary: Message | None,
    max_rows: int,
    max_chars: int,
    offset: int = 0,
) -> str:
    """A bounded table of ``messages`` (#, role, tokens if ``count`` is given, content)."""
    columns = 4 if count is not None else 3
    head = f'<th style="{_TH}">#</th><th style="{_TH}">role</th>'
    if count is not None:
        head += f'<th style="{_TH}">tokens</th>'
    head += f'<th style="{_TH} width: 100%;">content</th>'
    first, hidden, last = _split(len(messages), max_rows)
    rows: list[str] = []

    def row(pos: int) -> str:
        m = messages[pos]
        is_summary = _is_summary(m, summary)
        tint = "background: rgba(23,190,207,.10);" if is_summary else ""
        cells = f'<td style="{_TD} {_MUTED}">{pos + offset}</td>'
        cells += f'<td style="{_TD}">{_role_cell(m, summary=is_summary)}</td>'
        if count is not None:
            cells += f'<td style="{_TD} text-align: right;">{count(m):,}</td>'
        cells += f'<td style="{_TEXT}">{_message_body(m, max_chars)}</td>'
        return f'<tr style="{tint}">{cells}</tr>' if tint else f"<tr>{cells}</tr>"

    rows.extend(row(p) for p in first)
    if hidden:
        rows.append(_more_row(hidden, columns, "messages"))
    rows.extend(row(p) for p in last)
    if not rows:
        rows.append(f'<tr><td colspan="{columns}" style="{_TD} {_MUTED}">(no messages)</td></tr>')
    return (
        f'<table style="{_TABLE}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


# ---------------------------------------------------------------------- memory
def _policy_text(policy: object) -> str:
    parts = [str(getattr(policy, "strategy", policy))]
    for name in ("max_messages", "max_tokens", "keep_recent"):
        value = getattr(policy, name, None)
        if value is not None:
            parts.append(f"{name}={value:,}")
    return ", ".join(parts)


def memory_html(
    memory: MemoryView | HtmlViewable, *, max_rows: int = MAX_ROWS, max_chars: int = MAX_CHARS
) -> str:
    """A :class:`~marsys_mem.ConversationMemory` (or a :class:`MemoryView`) as HTML (bounded).

    Shows the agent, the message and token counts, the default policy and the messages
    (the first and last ``max_rows // 2`` when there are more than ``max_rows``). A memory
    renders itself through :class:`HtmlViewable`, handing over a :class:`MemoryView`.

    Example:
        >>> from marsys_mem import ConversationMemory
        >>> mem = ConversationMemory([Message.user(f"turn {i}") for i in range(100)])
        >>> html = memory_html(mem, max_rows=4)
        >>> "turn 0" in html, "turn 50" in html, "turn 99" in html, "96 more" in html
        (True, False, True, True)
    """
    _check_limits(max_rows, max_chars)
    if not isinstance(memory, MemoryView):
        return memory.__html_view__(max_rows=max_rows, max_chars=max_chars)
    total = len(memory.messages)
    agent = f"agent <code>{_e(memory.agent)}</code> · " if memory.agent else ""
    policy = f" · policy: {_e(_policy_text(memory.policy))}" if memory.policy is not None else ""
    summary = (
        f"{agent}{total:,} messages ({memory.appended:,} appended) · "
        f"{memory.tokens:,} tokens{policy}"
    )
    table = _message_rows(
        memory.messages,
        count=memory.count,
        summary=None,
        max_rows=max_rows,
        max_chars=max_chars,
    )
    return _box(memory.title, summary, table)


# ---------------------------------------------------------------------- window
def _bar(part: int, whole: int) -> str:
    pct = 100.0 if whole <= 0 else max(0.0, min(100.0, 100.0 * part / whole))
    return (
        '<div style="height: 6px; background: rgba(127,127,127,.2); border-radius: 3px; '
        f'margin: 4px 0;" title="{pct:.0f}% of the history\'s tokens">'
        f'<div style="width: {pct:.1f}%; height: 6px; background: #2ca02c; '
        'border-radius: 3px;"></div></div>'
    )


def window_html(
    window: WindowSource, *, max_rows: int = MAX_ROWS, max_chars: int = MAX_CHARS
) -> str:
    """A :class:`~marsys_mem.ContextWindow` as HTML: what it keeps, drops and costs.

    The bar shows the window's tokens as a share of the whole history's; the summary
    message (``summarize`` strategy) is highlighted.

    Example:
        >>> from marsys_mem import ContextPolicy, ConversationMemory
        >>> mem = ConversationMemory([Message.user(f"turn {i}") for i in range(10)])
        >>> html = window_html(mem.context(ContextPolicy(max_messages=3)))
        >>> "3 messages" in html, "history 10 messages" in html, "dropped 7" in html
        (True, True, True)
        >>> "turn 9" in html, "turn 6" in html
        (True, False)
    """
    _check_limits(max_rows, max_chars)
    saved = window.tokens_saved
    parts = [
        f"{_badge(window.strategy, '#555')}",
        f"{len(window.messages):,} messages, {window.tokens:,} tokens",
        f"history {window.history_messages:,} messages, {window.history_tokens:,} tokens"
        + (f" (saved {saved:,})" if saved > 0 else ""),
        f"dropped {window.dropped:,}",
    ]
    if window.summarized:
        parts.append(f"summarized {window.summarized:,} new")
    if window.summary is not None:
        parts.append("with summary")
    body = _bar(window.tokens, window.history_tokens) + _message_rows(
        window.messages,
        count=None,
        summary=window.summary,
        max_rows=max_rows,
        max_chars=max_chars,
    )
    return _box("ContextWindow", " · ".join(parts), body)


# ---------------------------------------------------------------------- graph
def _tree_order(graph: GraphSource) -> list[tuple[str, int]]:
    """(branch, depth) in depth-first order of the fork forest."""
    out: list[tuple[str, int]] = []
    stack = [(root, 0) for root in reversed(graph.roots())]
    while stack:
        branch, depth = stack.pop()
        out.append((branch, depth))
        stack.extend((child, depth + 1) for child in reversed(graph.children(branch)))
    return out


def graph_html(graph: GraphSource, *, max_rows: int = MAX_ROWS, max_chars: int = MAX_CHARS) -> str:
    """A :class:`~marsys_mem.coordination.BranchGraph` as an indented table of branches.

    Each row shows a branch (indented under its fork parent), its status, its agents and
    the branches it was merged into. For a picture use :meth:`BranchGraph.draw`.

    Example:
        >>> from marsys_mem.coordination import BranchGraph
        >>> g = BranchGraph()
        >>> _ = g.add_branch("main", agents=["planner"])
        >>> _ = g.fork("main", "r1", agents=["researcher"])
        >>> g.merge("r1", into="main")
        >>> html = graph_html(g)
        >>> "2 branches" in html, "merged" in html, "researcher" in html
        (True, True, True)
    """
    _check_limits(max_rows, max_chars)
    order = _tree_order(graph)
    merges = graph.merges()
    merged_into: dict[str, list[str]] = {}
    for child, into in merges:
        merged_into.setdefault(child, []).append(into)
    counts = {"active": 0, "merged": 0, "closed": 0}
    statuses = {b: graph.status(b) for b, _ in order}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    summary = (
        f"{len(order):,} branches ({counts['active']:,} active, {counts['merged']:,} merged, "
        f"{counts['closed']:,} closed) · {len(merges):,} merges"
    )
    head = "".join(
        f'<th style="{_TH}">{name}</th>' for name in ("branch", "status", "agents", "merged into")
    )
    first, hidden, last = _split(len(order), max_rows)

    def row(pos: int) -> str:
        branch, depth = order[pos]
        indent = "&nbsp;&nbsp;&nbsp;" * max(0, depth - 1) + ("└─ " if depth else "")
        status = statuses[branch]
        agents = ", ".join(graph.agents(branch))
        into = ", ".join(merged_into.get(branch, ()))
        return (
            f'<tr><td style="{_TD} white-space: nowrap;">{indent}<code>{_e(branch)}</code></td>'
            f'<td style="{_TD}">{_badge(status, _STATUS_COLORS.get(status, "#7f7f7f"))}</td>'
            f'<td style="{_TEXT}">{_cut(agents, max_chars)}</td>'
            f'<td style="{_TD}">{_cut(into, max_chars)}</td></tr>'
        )

    rows = [row(p) for p in first]
    if hidden:
        rows.append(_more_row(hidden, 4, "branches"))
    rows.extend(row(p) for p in last)
    if not rows:
        rows.append(f'<tr><td colspan="4" style="{_TD} {_MUTED}">(no branches)</td></tr>')
    table = (
        f'<table style="{_TABLE}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    return _box("BranchGraph", summary, table)


# ---------------------------------------------------------------------- reports
def _is_scalar(value: object) -> bool:
    return value is None or isinstance(
        value, str | bytes | int | float | bool | datetime | date | timedelta | enum.Enum
    )


def _is_structured(value: object) -> bool:
    """A value that gets its own section: a model, a dataclass, a mapping, a window..."""
    if isinstance(value, Message) or _is_scalar(value):
        return False
    if isinstance(value, BaseModel | Mapping):
        return True
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _fields(obj: Any) -> list[tuple[str, Any]]:
    """The (name, value) pairs of a pydantic model, a dataclass or a mapping."""
    if isinstance(obj, BaseModel):
        names = list(type(obj).model_fields) + list(obj.model_extra or {})
        return [(n, getattr(obj, n, None)) for n in names]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.repr]
    if isinstance(obj, Mapping):
        return [(str(k), v) for k, v in obj.items()]
    return []


def _section_title(key: str | None, value: Any, position: int) -> str:
    """A section's title: its key, else its ``agent``/``name``/``id`` field, else ``[i]``."""
    if key is not None:
        return key
    agent, branch = _attr(value, "agent"), _attr(value, "branch")
    if isinstance(agent, str) and agent and isinstance(branch, str) and branch:
        return f"{agent}@{branch}"
    for attr in ("agent", "name", "id", "branch"):
        found = _attr(value, attr)
        if isinstance(found, str) and found:
            return found
    return f"[{position}]"


def _attr(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)


def _is_record(value: Any) -> bool:
    """A model, dataclass or mapping whose fields are scalars or lists of scalars."""
    if not _is_structured(value) or isinstance(value, HtmlViewable):
        return False
    return all(
        _is_scalar(v) or (isinstance(v, list | tuple) and all(_is_scalar(x) for x in v))
        for _, v in _fields(value)
    )


class _Renderer:
    """Renders arbitrary report values to bounded, escaped HTML."""

    def __init__(self, max_rows: int, max_chars: int) -> None:
        self.max_rows = max_rows
        self.max_chars = max_chars

    def value(self, value: Any, depth: int) -> str:
        if _is_scalar(value):
            return self.scalar(value)
        if isinstance(value, Message):
            return message_html(value, max_chars=self.max_chars)
        if isinstance(value, HtmlViewable):
            return value.__html_view__(max_rows=self.max_rows, max_chars=self.max_chars)
        if depth >= _MAX_DEPTH:
            return _cut(repr(value), self.max_chars)
        if _is_structured(value):
            return self.fields(_fields(value), depth + 1)
        if isinstance(value, Iterable):
            return self.sequence(list(value), depth + 1)
        return _cut(repr(value), self.max_chars)

    def scalar(self, value: Any) -> str:
        if value is None:
            return f"<span style='{_MUTED}'>—</span>"
        if isinstance(value, bool):
            return "✓" if value else "✗"
        if isinstance(value, int):
            return f"{value:,}"
        if isinstance(value, float):
            return f"{value:,.4g}"
        if isinstance(value, datetime):
            return _e(value.isoformat(timespec="seconds"))
        if isinstance(value, enum.Enum):
            return _cut(str(value.value), self.max_chars)
        if isinstance(value, bytes):
            return f"<span style='{_MUTED}'>{len(value):,} bytes</span>"
        return _cut(str(value), self.max_chars)

    def fields(self, pairs: list[tuple[str, Any]], depth: int) -> str:
        """Scalars and short lists as a key/value table, structured values as sections."""
        plain = [(k, v) for k, v in pairs if not self.sectioned(v)]
        nested = [(k, v) for k, v in pairs if self.sectioned(v)]
        out: list[str] = []
        if plain:
            first, hidden, last = _split(len(plain), self.max_rows)
            rows = []
            for p in [*first, *last]:
                if hidden and p == last.start:
                    rows.append(_more_row(hidden, 2, "fields"))
                key, val = plain[p]
                rows.append(
                    f'<tr><th style="{_TH} border: none; white-space: nowrap;">{_e(key)}</th>'
                    f'<td style="{_TEXT}">{self.value(val, depth)}</td></tr>'
                )
            out.append(f'<table style="{_TABLE}"><tbody>{"".join(rows)}</tbody></table>')
        for key, val in nested:
            out.append(self.sections(key, val, depth))
        return "".join(out)

    def sectioned(self, value: Any) -> bool:
        """Whether a field gets its own collapsible section (not a table row)."""
        if _is_structured(value) or isinstance(value, HtmlViewable):
            return True
        if isinstance(value, list | tuple) and value:
            return any(_is_structured(v) or isinstance(v, Message) for v in value)
        return False

    def sections(self, key: str, value: Any, depth: int) -> str:
        """A titled section; a mapping or list of structured values: one per item (agent)."""
        items: list[tuple[str | None, Any]] | None = None
        if isinstance(value, Mapping) and value and all(_is_structured(v) for v in value.values()):
            items = [(str(k), v) for k, v in value.items()]
        elif isinstance(value, list | tuple) and all(_is_record(v) for v in value):
            return self.details(key, self.records(list(value)), len(value))
        elif isinstance(value, list | tuple) and all(_is_structured(v) for v in value):
            items = [(None, v) for v in value]
        if items is None:
            return self.details(
                key,
                self.value(value, depth),
                len(value) if isinstance(value, list | tuple) else None,
            )
        first, hidden, last = _split(len(items), self.max_rows)
        inner: list[str] = []
        for p in [*first, *last]:
            if hidden and p == last.start:
                inner.append(f"<div style='{_MUTED}'>… {hidden:,} more …</div>")
            title, item = items[p]
            inner.append(self.details(_section_title(title, item, p), self.value(item, depth)))
        return self.details(key, "".join(inner), len(items))

    def records(self, values: list[Any]) -> str:
        """Flat records as one table: a row each, a column per field that has a value."""
        rows = [dict(_fields(v)) for v in values]
        columns: list[str] = []
        for row in rows:
            columns.extend(k for k in row if k not in columns)
        columns = [c for c in columns if any(row.get(c) not in (None, [], ()) for row in rows)]
        head = "".join(f'<th style="{_TH}">{_e(c)}</th>' for c in columns)
        first, hidden, last = _split(len(rows), self.max_rows)
        body: list[str] = []
        for p in [*first, *last]:
            if hidden and p == last.start:
                body.append(_more_row(hidden, len(columns), "rows"))
            cells = "".join(
                f'<td style="{_TEXT}">{self.value(rows[p].get(c), _MAX_DEPTH - 1)}</td>'
                for c in columns
            )
            body.append(f"<tr>{cells}</tr>")
        return (
            f'<table style="{_TABLE}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>"
        )

    def details(self, title: str, body: str, count: int | None = None) -> str:
        badge = f" <span style='{_MUTED}'>({count:,})</span>" if count is not None else ""
        return (
            '<details open style="margin: 4px 0 4px 8px;">'
            f"<summary><b>{_e(title)}</b>{badge}</summary>"
            f'<div style="margin-left: 10px;">{body}</div></details>'
        )

    def sequence(self, values: list[Any], depth: int) -> str:
        if not values:
            return f"<span style='{_MUTED}'>(none)</span>"
        if all(isinstance(v, Message) for v in values):
            return _message_rows(
                values,
                count=None,
                summary=None,
                max_rows=self.max_rows,
                max_chars=self.max_chars,
            )
        first, hidden, last = _split(len(values), self.max_rows)
        shown = [self.value(values[p], depth) for p in first]
        if hidden:
            shown.append(f"<span style='{_MUTED}'>… {hidden:,} more</span>")
        shown.extend(self.value(values[p], depth) for p in last)
        if all(_is_scalar(v) for v in values):
            return ", ".join(shown)
        return (
            "<ol style='margin: 0; padding-left: 18px;'>"
            + "".join(f"<li>{s}</li>" for s in shown)
            + "</ol>"
        )


def report_html(
    report: Any,
    *,
    title: str | None = None,
    max_rows: int = MAX_ROWS,
    max_chars: int = MAX_CHARS,
) -> str:
    """Any report (a pydantic model, dataclass or mapping) as HTML, one section per agent.

    Scalar fields become a key/value table; a mapping or list of models (e.g. per-agent
    results keyed by agent name) becomes one collapsible section per item; messages and
    every :class:`HtmlViewable` value (context windows, memories, branch graphs) use their
    own views. Everything is
    bounded by ``max_rows`` and ``max_chars`` and escaped.

    Example:
        >>> from pydantic import BaseModel
        >>> class AgentReport(BaseModel):
        ...     messages: int
        ...     facts: list[str]
        >>> class Report(BaseModel):
        ...     workflow: str
        ...     agents: dict[str, AgentReport]
        >>> r = Report(workflow="team", agents={"planner": AgentReport(messages=3, facts=["x"])})
        >>> html = report_html(r)
        >>> "Report" in html and "planner" in html and "messages" in html
        True
    """
    _check_limits(max_rows, max_chars)
    renderer = _Renderer(max_rows, max_chars)
    name = title or type(report).__name__
    if _is_structured(report):
        body = renderer.fields(_fields(report), 1)
    else:
        body = renderer.value(report, 1)
    return _box(name, "", body)
