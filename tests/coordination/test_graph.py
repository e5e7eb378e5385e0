import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marsys_mem.coordination import BranchGraph, GraphChange
from marsys_mem.exceptions import BranchError, MarsysMemError, MergeCycleError, UnknownBranchError


@pytest.fixture
def tree() -> BranchGraph:
    #        main
    #       /    \
    #     r1      r2
    #    /  \
    #  r1a  r1b
    g = BranchGraph()
    g.add_branch("main", agents=["planner", "researcher"])
    g.fork("main", "r1")
    g.fork("main", "r2", agents=["writer"])
    g.fork("r1", "r1a", agents=["researcher"])
    g.fork("r1", "r1b")
    return g


def test_nodes_carry_id_agents_status_created_at(tree):
    node = tree.nx.nodes["r1"]
    assert node["id"] == "r1"
    assert node["agents"] == ("planner", "researcher")  # default: the parent's agents
    assert node["status"] == "active"
    assert node["created_at"].tzinfo is not None
    info = tree.info("r2")
    assert info.agents == ("writer",)
    assert info.parent == "main"
    assert tree.nx.edges["main", "r1"]["kind"] == "fork"


def test_family_relations(tree):
    assert tree.lineage("r1a") == ["main", "r1", "r1a"]
    assert tree.lineage("main") == ["main"]
    assert tree.ancestors("r1b") == ["main", "r1"]
    assert tree.descendants("main") == ["r1", "r2", "r1a", "r1b"]
    assert tree.descendants("r2") == []
    assert tree.siblings("r1") == ["r2"]
    assert tree.siblings("r1a") == ["r1b"]
    assert tree.siblings("main") == []
    assert tree.children("r1") == ["r1a", "r1b"]
    assert tree.roots() == ["main"]


def test_scopes(tree):
    assert tree.branches_in_scope("r1", "branch") == ["r1"]
    assert tree.branches_in_scope("r1", "subtree") == ["r1", "r1a", "r1b"]
    assert tree.branches_in_scope("r1", "lineage") == ["main", "r1", "r1a", "r1b"]
    assert tree.branches_in_scope("r1a", "lineage") == ["main", "r1", "r1a"]
    assert tree.branches_in_scope("r2", "global") == ["main", "r1", "r2", "r1a", "r1b"]
    assert tree.agents_in_scope("r1a", "branch") == {("researcher", "r1a")}
    assert tree.agents_in_scope("r2", "lineage") == {
        ("planner", "main"), ("researcher", "main"), ("writer", "r2")
    }
    with pytest.raises(ValueError, match="scope must be one of"):
        tree.branches_in_scope("r1", "everyone")  # type: ignore[arg-type]


def test_unknown_branch_errors_are_value_errors(tree):
    for call in (
        lambda: tree.lineage("nope"),
        lambda: tree.descendants("nope"),
        lambda: tree.fork("nope", "x"),
        lambda: tree.merge("nope", into="main"),
        lambda: tree.merge("r1", into="nope"),
        lambda: tree.branches_in_scope("nope", "global"),
    ):
        with pytest.raises(UnknownBranchError, match="unknown branch 'nope'") as info:
            call()
        assert isinstance(info.value, ValueError)
        assert isinstance(info.value, MarsysMemError)
    assert "x" not in tree


def test_bad_names_and_duplicates_change_nothing(tree):
    before = tree.to_dict()
    with pytest.raises(BranchError, match="already exists"):
        tree.fork("main", "r1")
    with pytest.raises(BranchError, match="already exists"):
        tree.add_branch("main")
    for bad in ("a/b", "a+b", "a#b", "", "x" * 300):
        with pytest.raises(ValueError, match="branch must be"):
            tree.fork("main", bad)
    with pytest.raises(ValueError, match="agent name"):
        tree.fork("main", "x", agents=["a@b"])
    with pytest.raises(TypeError):
        tree.add_branch("y", agents="planner")  # type: ignore[arg-type]
    assert tree.to_dict() == before


def test_merge_records_edge_and_status(tree):
    version = tree.version
    tree.merge("r1a", into="r1", strategy="summary", conflict="confidence")
    edge = tree.nx.edges["r1a", "r1"]
    assert edge["kind"] == "merge"
    assert edge["strategy"] == "summary"
    assert edge["conflict"] == "confidence"
    assert edge["count"] == 1
    assert tree.status("r1a") == "merged"
    assert tree.version > version
    tree.merge("r1a", into="r1")  # again: the edge counts
    assert tree.nx.edges["r1a", "r1"]["count"] == 2
    tree.merge("r1b", into="r2")  # into a cousin
    tree.merge("r2", into="main")  # back into the parent
    assert tree.merges() == [("r1a", "r1"), ("r1b", "r2"), ("r2", "main")]


def test_bad_merges_raise_and_change_nothing(tree):
    tree.merge("r2", into="r1b")
    before = (tree.to_dict(), tree.version)
    with pytest.raises(BranchError, match="into itself"):
        tree.merge("r1", into="r1")
    with pytest.raises(MergeCycleError, match="descends from"):
        tree.merge("main", into="r1a")
    with pytest.raises(MergeCycleError, match="cycle"):
        tree.merge("r1b", into="r2")  # r2 was merged into r1b
    with pytest.raises(ValueError, match="strategy"):
        tree.merge("r1", into="main", strategy="squash")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="conflict"):
        tree.merge("r1", into="main", conflict="oldest")  # type: ignore[arg-type]
    assert (tree.to_dict(), tree.version) == before
    assert issubclass(MergeCycleError, ValueError)


def test_transitive_merge_cycle_is_rejected():
    g = BranchGraph()
    for name in ("a", "b", "c"):
        g.add_branch(name)
    g.merge("a", into="b")
    g.merge("b", into="c")
    with pytest.raises(MergeCycleError):
        g.merge("c", into="a")


def test_closed_branches(tree):
    tree.close("r2")
    assert tree.status("r2") == "closed"
    with pytest.raises(BranchError, match="closed"):
        tree.fork("r2", "r2a")
    with pytest.raises(BranchError, match="closed"):
        tree.merge("r1", into="r2")


def test_agents_and_change_notifications(tree):
    changes: list[GraphChange] = []
    unsubscribe = tree.subscribe(changes.append)
    assert tree.add_agent("r2", "critic") is True
    assert tree.add_agent("r2", "critic") is False
    tree.fork("r2", "r2a")
    assert tree.remove_agent("r2", "critic") is True
    assert tree.remove_agent("r2", "critic") is False
    unsubscribe()
    tree.add_agent("r2", "late")
    assert [(c.kind, c.branch, c.agents) for c in changes] == [
        ("add_agent", "r2", ("critic",)),
        ("fork", "r2a", ("writer", "critic")),
        ("remove_agent", "r2", ("critic",)),
    ]
    assert tree.agents("r2") == ["writer", "late"]


def test_to_dict_round_trip_is_json(tree):
    tree.merge("r1a", into="main")
    data = json.loads(json.dumps(tree.to_dict()))
    again = BranchGraph.from_dict(data)
    assert again.to_dict() == tree.to_dict()
    assert again.status("r1a") == "merged"
    assert again.descendants("r1") == ["r1a", "r1b"]


def test_repr(tree):
    tree.merge("r1a", into="r1")
    tree.close("r2")
    assert repr(tree) == "BranchGraph(branches=5, active=3, merged=1, closed=1)"


def test_draw_returns_a_figure(tree):
    # matplotlib comes with the notebooks extra (and dev); never skipped
    from matplotlib.figure import Figure

    tree.merge("r1a", into="main")
    fig = tree.draw()
    assert isinstance(fig, Figure)
    assert fig.axes
    fig2 = Figure()
    ax = fig2.add_subplot()
    assert tree.draw(ax=ax) is fig2


def test_draw_without_matplotlib_names_the_extra(tree, monkeypatch):
    import builtins

    from marsys_mem.exceptions import MissingDependencyError

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(MissingDependencyError, match="notebooks"):
        tree.draw()


@st.composite
def fork_trees(draw):
    n = draw(st.integers(1, 12))
    parents = [None] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    return parents


@given(fork_trees(), st.data())
def test_scope_invariants(parents, data):
    g = BranchGraph()
    for i, p in enumerate(parents):
        if p is None:
            g.add_branch(f"b{i}", agents=[f"a{i}"])
        else:
            g.fork(f"b{p}", f"b{i}", agents=[f"a{i}"])
    b = f"b{data.draw(st.integers(0, len(parents) - 1))}"
    branch = set(g.branches_in_scope(b, "branch"))
    subtree = set(g.branches_in_scope(b, "subtree"))
    lineage = set(g.branches_in_scope(b, "lineage"))
    everyone = set(g.branches_in_scope(b, "global"))
    assert branch == {b}
    assert branch <= subtree <= lineage <= everyone == set(g.branches)
    assert subtree == {b, *g.descendants(b)}
    assert lineage == {*g.lineage(b), *g.descendants(b)}
    for d in g.descendants(b):
        assert b in g.lineage(d)
    for s in g.siblings(b):
        assert g.parent(s) == g.parent(b)
