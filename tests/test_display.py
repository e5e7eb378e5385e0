import dataclasses
import re

import pytest
from pydantic import BaseModel

from marsys_mem import ContextPolicy, ConversationMemory, Message, ToolCall
from marsys_mem.coordination import BranchGraph
from marsys_mem.display import (
    graph_html,
    memory_html,
    message_html,
    report_html,
    window_html,
)

SCRIPT = "<script>alert('x')</script>"
ESCAPED = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"


def tool_memory() -> ConversationMemory:
    mem = ConversationMemory(
        [Message.system("You are terse."), Message.user("Goal: stay under budget", pinned=True)],
        agent="planner",
    )
    mem.add(Message.user("Weather in Tokyo?", name="alice"))
    call = ToolCall(id="c1", name="weather", arguments={"city": "Tokyo"})
    mem.add(Message.assistant("", tool_calls=[call]))
    mem.add(Message.tool("72F", tool_call_id="c1", name="weather"))
    return mem


def long_memory(n: int) -> ConversationMemory:
    return ConversationMemory([Message.user(f"turn-{i:05d}") for i in range(n)])


def visible_turns(html: str) -> list[str]:
    return re.findall(r"turn-\d{5}", html)


# ---------------------------------------------------------------------- escaping
def test_script_in_a_message_is_escaped_everywhere():
    mem = ConversationMemory([Message.system("s"), Message.user(SCRIPT, name="<b>eve</b>")])
    win = mem.context(ContextPolicy(max_messages=5))
    for html in (memory_html(mem), window_html(win), message_html(mem[1])):
        assert "<script>" not in html
        assert ESCAPED in html
        assert "<b>eve</b>" not in html
        assert "&lt;b&gt;eve&lt;/b&gt;" in html


def test_tool_arguments_agent_names_and_report_values_are_escaped():
    call = ToolCall(id='c"1', name="run", arguments={"code": SCRIPT})
    mem = ConversationMemory([Message.assistant("", tool_calls=[call])], agent="<i>a</i>")
    html = memory_html(mem)
    assert "<script>" not in html
    assert "<i>a</i>" not in html
    assert "&lt;i&gt;a&lt;/i&gt;" in html
    assert "c&quot;1" in html

    class Report(BaseModel):
        note: str
        agents: dict[str, dict[str, str]]

    html = report_html(Report(note=SCRIPT, agents={"<x>": {"k": SCRIPT}}))
    assert "<script>" not in html
    assert "<x>" not in html
    assert html.count(ESCAPED) == 2


def test_graph_names_are_escaped():
    g = BranchGraph()
    g.add_branch("main", agents=["<img src=x onerror=alert(1)>"])
    html = graph_html(g)
    assert "<img" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


# ---------------------------------------------------------------------- truncation
def test_long_history_shows_first_and_last_rows_with_a_more_row():
    mem = long_memory(1000)
    html = memory_html(mem, max_rows=10)
    assert visible_turns(html) == [
        f"turn-{i:05d}" for i in [0, 1, 2, 3, 4, 995, 996, 997, 998, 999]
    ]
    assert "… 990 more messages …" in html


def test_output_size_does_not_grow_with_the_history():
    small = len(memory_html(long_memory(30)))
    big = len(memory_html(long_memory(20_000)))
    assert big < small * 1.2
    assert len(visible_turns(memory_html(long_memory(20_000)))) == 20  # default MAX_ROWS


def test_short_history_has_no_more_row():
    html = memory_html(long_memory(5))
    assert len(visible_turns(html)) == 5
    assert "more messages" not in html


def test_long_texts_are_cut():
    mem = ConversationMemory([Message.user("x" * 10_000 + "TAIL")])
    html = memory_html(mem, max_chars=50)
    assert "TAIL" not in html
    assert "x" * 49 + "…" in html
    assert len(html) < 5_000


def test_window_rows_are_bounded_too():
    mem = long_memory(300)
    win = mem.context(ContextPolicy(max_messages=200))
    html = window_html(win, max_rows=6)
    assert visible_turns(html) == [f"turn-{i:05d}" for i in [100, 101, 102, 297, 298, 299]]
    assert "194 more messages" in html


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_bad_limits_are_rejected(bad):
    with pytest.raises(ValueError, match="max_rows"):
        memory_html(long_memory(3), max_rows=bad)
    with pytest.raises(ValueError, match="max_chars"):
        report_html({"a": 1}, max_chars=bad)


# ---------------------------------------------------------------------- content
def test_memory_view_shows_roles_tools_counts_and_policy():
    mem = tool_memory()
    html = memory_html(mem)
    for text in (
        "ConversationMemory",
        "planner",
        "5 messages (3 appended)",
        f"{mem.total_tokens:,} tokens",
        "sliding_window",
        "weather(",
        "&quot;city&quot;: &quot;Tokyo&quot;",
        "result of [c1]",
        "alice",
        "📌",
    ):
        assert text in html, text
    for role in ("system", "user", "assistant", "tool"):
        assert f">{role}</span>" in html


def test_window_view_shows_counts_savings_and_the_summary():
    mem = ConversationMemory([Message.system("Be brief.")])
    for i in range(40):
        mem.add(Message.user(f"question {i} about the itinerary and the hotels in Porto"))
        mem.add(Message.assistant(f"answer {i}: the hotel near the river is fine"))
    policy = ContextPolicy(max_tokens=300, strategy="summarize", keep_recent=4)
    win = mem.context(policy)
    assert win.summary is not None
    html = window_html(win)
    assert "ContextWindow" in html
    assert "summarize" in html
    assert f"{len(win)} messages, {win.tokens} tokens" in html
    assert (
        f"history 81 messages, {win.history_tokens:,} tokens (saved {win.tokens_saved:,})" in html
    )
    assert f"dropped {win.dropped}" in html
    assert ">summary</span>" in html  # the summary message is labelled
    assert "rgba(23,190,207" in html  # and highlighted


def test_context_window_repr_is_short():
    mem = long_memory(500)
    win = mem.context(ContextPolicy(max_messages=10))
    text = repr(win)
    assert text == (
        f"ContextWindow(strategy='sliding_window', messages=10, tokens={win.tokens}, "
        f"dropped=490, history_messages=500, history_tokens={win.history_tokens})"
    )
    assert "turn-" not in text
    summarized = mem.context(ContextPolicy(max_tokens=200, strategy="summarize", keep_recent=2))
    assert repr(summarized).endswith(", summary=True)")


def test_graph_view_shows_tree_statuses_agents_and_merges():
    g = BranchGraph()
    g.add_branch("main", agents=["planner"])
    g.fork("main", "r1", agents=["researcher"])
    g.fork("main", "r2", agents=["critic"])
    g.fork("r1", "r1a")
    g.merge("r2", into="main")
    g.close("r1a")
    html = graph_html(g)
    assert "4 branches (2 active, 1 merged, 1 closed) · 1 merges" in html
    order = [html.index(f"<code>{b}</code>") for b in ("main", "r1", "r1a", "r2")]
    assert order == sorted(order)  # depth-first tree order
    assert "└─ <code>r1</code>" in html
    assert "&nbsp;&nbsp;&nbsp;└─ <code>r1a</code>" in html
    for text in ("planner", "researcher", "critic", ">merged</span>", ">closed</span>"):
        assert text in html
    row_r2 = html[html.index("<code>r2</code>") :]
    assert "main</td></tr>" in row_r2  # merged into main


def test_big_graph_is_bounded():
    g = BranchGraph()
    g.add_branch("main")
    for i in range(200):
        g.fork("main", f"b{i:03d}")
    html = graph_html(g, max_rows=6)
    assert "… 195 more branches …" in html
    assert "b199" in html
    assert "b100" not in html


# ---------------------------------------------------------------------- reports
class AgentReport(BaseModel):
    messages_stored: int
    facts: list[str]
    window: list[Message]
    score: float = 0.5


class WorkflowReport(BaseModel):
    workflow: str
    ok: bool
    agents: dict[str, AgentReport]


def test_report_has_one_section_per_agent():
    report = WorkflowReport(
        workflow="research-team",
        ok=True,
        agents={
            "planner": AgentReport(
                messages_stored=3, facts=["Q4 grew 12%"], window=[Message.user("plan it")]
            ),
            "researcher": AgentReport(messages_stored=7, facts=[], window=[]),
        },
    )
    html = report_html(report)
    assert "WorkflowReport" in html
    assert "research-team" in html
    assert "✓" in html
    # agents, planner, planner's window (researcher's is empty: a row), researcher
    assert html.count("<details") == 4
    assert "<summary><b>planner</b>" in html
    assert "<summary><b>researcher</b>" in html
    assert "messages_stored" in html
    assert "Q4 grew 12%" in html
    assert "plan it" in html
    assert html.index("planner") < html.index("researcher")


def test_report_list_of_models_uses_the_agent_field_as_title_and_renders_windows():
    @dataclasses.dataclass
    class Entry:
        agent: str
        window: object

    mem = long_memory(50)
    win = mem.context(ContextPolicy(max_messages=5))
    html = report_html({"results": [Entry("alpha", win), Entry("beta", mem)]}, title="Run")
    assert "<b>Run</b>" in html
    assert "<summary><b>alpha</b>" in html
    assert "<summary><b>beta</b>" in html
    assert "ContextWindow" in html
    assert "ConversationMemory" in html


def test_report_lists_are_bounded():
    html = report_html({"numbers": list(range(1000)), "rows": [{"i": i} for i in range(500)]})
    assert "… 980 more" in html
    assert "… 480 more" in html
    assert ">999<" not in html  # a scalar list is one comma-joined cell
    assert ", 999</td>" in html
    assert ", 500," not in html
    assert "… 480 more rows …" in html  # flat records: one table row each
    assert ">499</td></tr>" in html
    assert ">250</td></tr>" not in html


def test_report_flat_records_become_one_table_and_nested_ones_sections():
    class Hit(BaseModel):
        rank: int
        text: str
        note: str | None = None  # never set: no column

    class Ask(BaseModel):
        agent: str
        branch: str
        hits: list[Hit]

    class Report(BaseModel):
        asks: list[Ask]
        unnamed: list[dict[str, object]]

    report = Report(
        asks=[Ask(agent="planner", branch="main", hits=[Hit(rank=1, text="Q4 grew")])],
        unnamed=[{"nested": {"deep": 1}}, {"nested": {"deep": 2}}],
    )
    html = report_html(report)
    assert "<summary><b>planner@main</b>" in html
    assert '">rank</th>' in html
    assert '">text</th>' in html
    assert '">note</th>' not in html
    assert "<summary><b>[0]</b>" in html
    assert "<summary><b>[1]</b>" in html


def test_report_of_a_scalar_and_of_a_graph():
    assert "42" in report_html(42)
    g = BranchGraph()
    g.add_branch("main")
    assert "BranchGraph" in report_html({"graph": g})


# ---------------------------------------------------------------------- notebook hooks
def test_repr_html_methods_delegate_to_display():
    mem = tool_memory()
    win = mem.context(ContextPolicy(max_messages=10))
    g = BranchGraph()
    g.add_branch("main", agents=["planner"])
    assert mem._repr_html_() == memory_html(mem)
    assert win._repr_html_() == window_html(win)
    assert g._repr_html_() == graph_html(g)


def test_ipython_picks_up_the_html_repr():
    from IPython.core.formatters import DisplayFormatter  # ipykernel (dev extra) brings it

    data, _ = DisplayFormatter().format(tool_memory())
    assert "ConversationMemory" in data["text/html"]
    assert data["text/plain"].startswith("ConversationMemory(agent='planner'")


def test_workflow_report_renders_as_html(tmp_path):
    from marsys_mem.workflow import run_workflow

    wf = tmp_path / "wf.yaml"
    wf.write_text(
        "version: 1\nname: tiny\nagents: [{name: a}]\n"
        "memory: {version: 1, defaults: {patterns: {embedder: none}}}\n"
        "steps:\n  - say: {agent: a, text: 'hello <b>world</b>'}\n"
    )
    report = run_workflow(wf, store_dir=tmp_path / "store")
    html = report._repr_html_()
    assert "tiny" in html
    assert "<b>world</b>" not in html


# ---------------------------------------------------------------------- the protocol
def test_viewed_objects_implement_the_html_view_protocol():
    from marsys_mem.display import HtmlViewable

    mem = tool_memory()
    win = mem.context(ContextPolicy(max_messages=5))
    g = BranchGraph()
    g.add_branch("main")
    for obj in (mem, win, g):
        assert isinstance(obj, HtmlViewable)
    assert not isinstance(Message.user("x"), HtmlViewable)
    assert mem.__html_view__(max_rows=2, max_chars=50) == memory_html(mem, max_rows=2, max_chars=50)
    assert win.__html_view__(max_rows=2, max_chars=50) == window_html(win, max_rows=2, max_chars=50)
    assert g.__html_view__(max_rows=2, max_chars=50) == graph_html(g, max_rows=2, max_chars=50)


def test_report_shows_any_html_viewable_value_with_its_own_view_and_limits():
    seen: list[tuple[int, int]] = []

    class Gauge:
        def __html_view__(self, *, max_rows: int, max_chars: int) -> str:
            seen.append((max_rows, max_chars))
            return "<meter value='0.5'></meter>"

    html = report_html({"load": Gauge(), "items": [Gauge()]}, max_rows=7, max_chars=40)
    assert html.count("<meter value='0.5'></meter>") == 2
    assert seen == [(7, 40), (7, 40)]
    assert "<summary><b>load</b>" in html  # a viewable value gets its own section


def test_a_memory_view_renders_from_plain_data():
    from marsys_mem.display import MemoryView

    rows = [Message.user(f"turn-{i:05d}") for i in range(50)]
    html = memory_html(
        MemoryView(rows, agent="<a>", appended=5, tokens=1234, count=lambda m: 7), max_rows=4
    )
    assert "agent <code>&lt;a&gt;</code>" in html
    assert "50 messages (5 appended) · 1,234 tokens" in html
    assert "policy" not in html
    assert visible_turns(html) == ["turn-00000", "turn-00001", "turn-00048", "turn-00049"]
    assert '">tokens</th>' in html
    assert 'text-align: right;">7</td>' in html
    no_counts = memory_html(MemoryView(rows))
    assert '">tokens</th>' not in no_counts


def test_memory_view_reads_only_the_rows_it_shows():
    from marsys_mem.display import MemoryView

    class Rows:
        def __init__(self) -> None:
            self.read: list[int] = []

        def __len__(self) -> int:
            return 1_000_000

        def __getitem__(self, position: int) -> Message:
            self.read.append(position)
            return Message.user(f"turn-{position:05d}")

    rows = Rows()
    memory_html(MemoryView(rows), max_rows=4)
    assert sorted(rows.read) == [0, 1, 999_998, 999_999]
