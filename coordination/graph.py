"""BranchGraph: the branches of a multi-agent workflow, how they forked and merged.

Branches are the nodes of a :class:`networkx.DiGraph` (attributes ``id``, ``agents``,
``status``, ``created_at``); edges carry ``kind="fork"`` (parent to child) or
``kind="merge"`` (child to the branch it was merged into). The fork edges form a forest:
every branch has at most one parent. Family relations (:meth:`~BranchGraph.lineage`,
:meth:`~BranchGraph.ancestors`, :meth:`~BranchGraph.descendants`,
:meth:`~BranchGraph.siblings`) and fact scopes follow the fork edges only:

* ``branch``: the branch itself.
* ``subtree``: the branch and its descendants.
* ``lineage``: its ancestors, itself and its descendants.
* ``global``: every branch.

The graph only records structure. Memories (a fork's copy-on-write history) and facts (a
merge bringing the child's facts into the target) are handled by
:class:`~marsys_mem.coordination.Coordinator`, which also listens to graph changes so that
agents added here receive the facts already in their scope.

Merge rules (:meth:`~BranchGraph.check_merge`): both branches exist, differ, ``into`` is
not closed, ``into`` does not descend from ``child`` (the descendant already derives from
it: merging would make history flow in a circle), and merge edges stay acyclic (after
``r1`` was merged into ``r2``, ``r2`` cannot be merged into ``r1``). Merging a child back
into its parent or an ancestor, or into a sibling, is the normal case. A bad operation
raises a :class:`~marsys_mem.coordination.BranchError` (a ``ValueError``) and changes
nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, get_args

import networkx as nx
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from marsys_mem.display import MAX_CHARS, MAX_ROWS, graph_html
from marsys_mem.exceptions import (
    BranchError,
    MergeCycleError,
    MissingDependencyError,
    UnknownBranchError,
)
from marsys_mem.model.facts import SCOPES, FactScope
from marsys_mem.model.names import validate_name
from marsys_mem.patterns.shared import ConflictRule

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "BranchGraph",
    "BranchInfo",
    "BranchStatus",
    "GraphChange",
    "MergeStrategy",
]

BranchStatus = Literal["active", "merged", "closed"]
MergeStrategy = Literal["facts", "summary", "messages"]
ChangeKind = Literal["add_branch", "fork", "merge", "close", "add_agent", "remove_agent"]
_STRATEGIES: tuple[str, ...] = get_args(MergeStrategy)
_RULES: tuple[str, ...] = get_args(ConflictRule)
_COLORS = {"active": "#4C9BE8", "merged": "#8BC34A", "closed": "#B0B0B0"}


def _check_agent(agent: object) -> str:
    return validate_name("agent name", agent)  # the one naming rule (marsys_mem.model.names)


def _agent_list(agents: Iterable[str] | None) -> list[str]:
    if agents is None:
        return []
    if isinstance(agents, str):
        raise TypeError("agents must be a list of names, not a single string")
    out: list[str] = []
    for agent in agents:
        if _check_agent(agent) not in out:
            out.append(agent)
    return out


class BranchInfo(BaseModel):
    """A snapshot of one branch: its id, agents, status, creation time and fork parent.

    Example:
        >>> g = BranchGraph()
        >>> g.add_branch("main", agents=["planner"]).agents
        ('planner',)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    agents: tuple[str, ...] = ()
    status: BranchStatus = "active"
    created_at: AwareDatetime = Field(default_factory=lambda: datetime.now(UTC))
    parent: str | None = None


@dataclass(frozen=True, slots=True)
class GraphChange:
    """What changed in a :class:`BranchGraph` (passed to :meth:`BranchGraph.subscribe`).

    ``agents``: the agents added (``add_branch``, ``fork``, ``add_agent``) or removed;
    ``source``: the fork parent or the merged child.

    Example:
        >>> GraphChange("fork", "r1", ("researcher",), source="main").source
        'main'
    """

    kind: ChangeKind
    branch: str
    agents: tuple[str, ...] = ()
    source: str | None = None


class BranchGraph:
    """The branch graph of a workflow (a networkx DiGraph of fork and merge edges).

    Example:
        >>> g = BranchGraph()
        >>> _ = g.add_branch("main", agents=["planner", "researcher"])
        >>> _ = g.fork("main", "r1")                      # agents default to the parent's
        >>> _ = g.fork("main", "r2", agents=["researcher"])
        >>> _ = g.fork("r1", "r1a")
        >>> g.lineage("r1a"), g.descendants("main"), g.siblings("r1")
        (['main', 'r1', 'r1a'], ['r1', 'r2', 'r1a'], ['r2'])
        >>> g.branches_in_scope("r1", "subtree")
        ['r1', 'r1a']
        >>> sorted(g.agents_in_scope("r2", "lineage"))
        [('planner', 'main'), ('researcher', 'main'), ('researcher', 'r2')]
        >>> g.merge("r2", into="main")
        >>> g.status("r2")
        'merged'
        >>> g
        BranchGraph(branches=4, active=3, merged=1, closed=0)
    """

    def __init__(self) -> None:
        self._g: nx.DiGraph = nx.DiGraph()
        self._parent: dict[str, str | None] = {}
        self._children: dict[str, list[str]] = {}
        self._agents: dict[str, list[str]] = {}
        self._listeners: list[Callable[[GraphChange], Any]] = []
        self._lock = threading.RLock()
        self.version = 0  # bumped on every change

    # ------------------------------------------------------------------ reading
    @property
    def nx(self) -> nx.DiGraph:
        """A read-only view of the underlying networkx DiGraph."""
        return self._g.copy(as_view=True)

    @property
    def branches(self) -> list[str]:
        """Every branch, in creation order."""
        return list(self._parent)

    def __contains__(self, branch: object) -> bool:
        return branch in self._parent

    def __len__(self) -> int:
        return len(self._parent)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._parent))

    def _require(self, branch: object) -> str:
        if not isinstance(branch, str) or branch not in self._parent:
            known = ", ".join(list(self._parent)[:20]) or "none"
            raise UnknownBranchError(f"unknown branch {branch!r} (known: {known})")
        return branch

    def info(self, branch: str) -> BranchInfo:
        """A snapshot of ``branch``."""
        node = self._g.nodes[self._require(branch)]
        return BranchInfo(
            id=branch,
            agents=tuple(self._agents[branch]),
            status=node["status"],
            created_at=node["created_at"],
            parent=self._parent[branch],
        )

    def agents(self, branch: str) -> list[str]:
        """The agents of ``branch``, in the order they joined."""
        return list(self._agents[self._require(branch)])

    def status(self, branch: str) -> BranchStatus:
        """``active``, ``merged`` or ``closed``."""
        status: BranchStatus = self._g.nodes[self._require(branch)]["status"]
        return status

    def parent(self, branch: str) -> str | None:
        """The branch ``branch`` was forked from (``None`` for a root)."""
        return self._parent[self._require(branch)]

    def children(self, branch: str) -> list[str]:
        """The branches forked from ``branch``, in creation order."""
        return list(self._children[self._require(branch)])

    def roots(self) -> list[str]:
        """Branches that were added, not forked."""
        return [b for b, p in self._parent.items() if p is None]

    def merges(self) -> list[tuple[str, str]]:
        """``(child, into)`` of every merge edge, by time of the latest merge."""
        edges = [(d["created_at"], u, v) for u, v, d in self._g.edges(data=True)]
        return [(u, v) for _, u, v in sorted(edges) if self._g[u][v]["kind"] == "merge"]

    def lineage(self, branch: str) -> list[str]:
        """The fork path from the root down to ``branch`` (both included)."""
        path = [self._require(branch)]
        parent = self._parent[branch]
        while parent is not None:
            path.append(parent)
            parent = self._parent[parent]
        return path[::-1]

    def ancestors(self, branch: str) -> list[str]:
        """The branches ``branch`` descends from, root first."""
        return self.lineage(branch)[:-1]

    def descendants(self, branch: str) -> list[str]:
        """Everything forked from ``branch``, directly or not (breadth first)."""
        out: list[str] = []
        frontier = list(self._children[self._require(branch)])
        while frontier:
            out.extend(frontier)
            frontier = [c for b in frontier for c in self._children[b]]
        return out

    def siblings(self, branch: str) -> list[str]:
        """The other children of ``branch``'s parent (a root has none)."""
        parent = self._parent[self._require(branch)]
        if parent is None:
            return []
        return [c for c in self._children[parent] if c != branch]

    def branches_in_scope(self, branch: str, scope: FactScope) -> list[str]:
        """The branches a fact shared on ``branch`` with ``scope`` reaches (creation order).

        Raises:
            UnknownBranchError: ``branch`` is not in the graph.
            ValueError: ``scope`` is not one of ``branch``, ``subtree``, ``lineage``,
                ``global``.
        """
        self._require(branch)
        if scope == "branch":
            return [branch]
        if scope == "global":
            return list(self._parent)
        if scope == "subtree":
            members = {branch, *self.descendants(branch)}
        elif scope == "lineage":
            members = {*self.lineage(branch), *self.descendants(branch)}
        else:
            raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
        return [b for b in self._parent if b in members]

    def agents_in_scope(self, branch: str, scope: FactScope) -> set[tuple[str, str]]:
        """``(agent, branch)`` of every agent a fact shared on ``branch`` with ``scope`` reaches."""
        return {(a, b) for b in self.branches_in_scope(branch, scope) for a in self._agents[b]}

    # ------------------------------------------------------------------ changing
    def subscribe(self, callback: Callable[[GraphChange], Any]) -> Callable[[], None]:
        """Call ``callback(change)`` after every change; returns an unsubscribe function."""
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        self._listeners.append(callback)

        def unsubscribe() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return unsubscribe

    def _changed(self, change: GraphChange) -> None:
        self.version += 1
        for callback in list(self._listeners):
            callback(change)

    def _new_node(
        self, name: str, agents: list[str], parent: str | None, now: datetime | None = None
    ) -> BranchInfo:
        now = now or datetime.now(UTC)
        self._g.add_node(name, id=name, agents=tuple(agents), status="active", created_at=now)
        self._parent[name] = parent
        self._children[name] = []
        self._agents[name] = agents
        if parent is not None:
            self._children[parent].append(name)
            self._g.add_edge(parent, name, kind="fork", created_at=now)
        return BranchInfo(id=name, agents=tuple(agents), created_at=now, parent=parent)

    def _check_new(self, name: object) -> str:
        validate_name("branch", name)
        assert isinstance(name, str)
        if name in self._parent:
            raise BranchError(f"branch {name!r} already exists")
        return name

    def add_branch(self, name: str, agents: Iterable[str] | None = None) -> BranchInfo:
        """Add a root branch with ``agents``.

        Raises:
            BranchError: the branch exists.
            ValueError: a bad branch or agent name.
        """
        with self._lock:
            self._check_new(name)
            members = _agent_list(agents)
            info = self._new_node(name, members, None)
            self._changed(GraphChange("add_branch", name, tuple(members)))
        return info

    def fork(self, parent: str, child: str, agents: Iterable[str] | None = None) -> BranchInfo:
        """Fork ``child`` from ``parent``; ``agents`` default to the parent's agents.

        Raises:
            UnknownBranchError: ``parent`` is not in the graph.
            BranchError: ``child`` exists, or ``parent`` is closed.
        """
        with self._lock:
            self._require(parent)
            self._check_new(child)
            if self.status(parent) == "closed":
                raise BranchError(f"cannot fork from closed branch {parent!r}")
            members = list(self._agents[parent]) if agents is None else _agent_list(agents)
            info = self._new_node(child, members, parent)
            self._changed(GraphChange("fork", child, tuple(members), source=parent))
        return info

    def check_merge(self, child: str, into: str) -> None:
        """Raise if ``merge(child, into)`` is not allowed (see the module docstring).

        Raises:
            UnknownBranchError: either branch is not in the graph.
            BranchError: ``child == into``, or ``into`` is closed.
            MergeCycleError: ``into`` descends from ``child``, or the merge edges would
                form a cycle.
        """
        self._require(child)
        self._require(into)
        if child == into:
            raise BranchError(f"cannot merge branch {child!r} into itself")
        if self.status(into) == "closed":
            raise BranchError(f"cannot merge into closed branch {into!r}")
        if child in self.ancestors(into):
            raise MergeCycleError(
                f"cannot merge {child!r} into {into!r}: {into!r} descends from {child!r} and "
                "already derives from it (merge would make history flow in a cycle)"
            )
        merge_edges = nx.DiGraph((u, v) for u, v, k in self._g.edges(data="kind") if k == "merge")
        if into in merge_edges and child in merge_edges and nx.has_path(merge_edges, into, child):
            raise MergeCycleError(
                f"cannot merge {child!r} into {into!r}: {into!r} was already merged into "
                f"{child!r} (directly or through other merges), which would form a cycle"
            )

    def merge(
        self,
        child: str,
        into: str,
        *,
        strategy: MergeStrategy = "facts",
        conflict: ConflictRule = "newest",
    ) -> None:
        """Record that ``child`` was merged into ``into``; ``child`` becomes ``merged``.

        Only the structure changes: :meth:`Coordinator.merge
        <marsys_mem.coordination.Coordinator.merge>` moves facts and messages. Merging the
        same pair again updates the edge (``count``, ``strategy``, ``conflict``).

        Raises:
            ValueError: an unknown strategy or conflict rule.
            UnknownBranchError, BranchError, MergeCycleError: see :meth:`check_merge`.
        """
        if strategy not in _STRATEGIES:
            raise ValueError(f"strategy must be one of {_STRATEGIES}, got {strategy!r}")
        if conflict not in _RULES:
            raise ValueError(f"conflict must be one of {_RULES}, got {conflict!r}")
        with self._lock:
            self.check_merge(child, into)
            edge = self._g.get_edge_data(child, into)
            count = 1 if edge is None else int(edge.get("count", 0)) + 1
            self._g.add_edge(
                child,
                into,
                kind="merge",
                strategy=strategy,
                conflict=conflict,
                count=count,
                created_at=datetime.now(UTC),
            )
            self._g.nodes[child]["status"] = "merged"
            self._changed(GraphChange("merge", into, source=child))

    def close(self, branch: str) -> None:
        """Mark ``branch`` closed: no forks from it, no merges into it."""
        with self._lock:
            self._g.nodes[self._require(branch)]["status"] = "closed"
            self._changed(GraphChange("close", branch))

    def add_agent(self, branch: str, agent: str) -> bool:
        """Add ``agent`` to ``branch``; ``False`` if it was already there."""
        with self._lock:
            self._require(branch)
            _check_agent(agent)
            members = self._agents[branch]
            if agent in members:
                return False
            members.append(agent)
            self._g.nodes[branch]["agents"] = tuple(members)
            self._changed(GraphChange("add_agent", branch, (agent,)))
        return True

    def remove_agent(self, branch: str, agent: str) -> bool:
        """Remove ``agent`` from ``branch``; ``False`` if it was not there."""
        with self._lock:
            members = self._agents[self._require(branch)]
            if agent not in members:
                return False
            members.remove(agent)
            self._g.nodes[branch]["agents"] = tuple(members)
            self._changed(GraphChange("remove_agent", branch, (agent,)))
        return True

    # ------------------------------------------------------------------ export
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description: ``branches`` (creation order) and ``edges``.

        Example:
            >>> g = BranchGraph()
            >>> _ = g.add_branch("main", agents=["a"])
            >>> _ = g.fork("main", "r1")
            >>> d = g.to_dict()
            >>> [b["id"] for b in d["branches"]], d["edges"][0]["kind"]
            (['main', 'r1'], 'fork')
            >>> BranchGraph.from_dict(d).lineage("r1")
            ['main', 'r1']
        """
        branches = [self.info(b).model_dump(mode="json") for b in self._parent]
        edges = []
        for u, v, data in self._g.edges(data=True):
            edge = {"source": u, "target": v}
            for key, value in data.items():
                edge[key] = value.isoformat() if isinstance(value, datetime) else value
            edges.append(edge)
        return {"branches": branches, "edges": edges}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BranchGraph:
        """Rebuild a graph from :meth:`to_dict` output (validated)."""
        graph = cls()
        for raw in data.get("branches", []):
            info = BranchInfo.model_validate(raw)
            if info.parent is not None:
                graph._require(info.parent)
            graph._check_new(info.id)
            members = _agent_list(info.agents)
            graph._new_node(info.id, members, info.parent, info.created_at)
            graph._g.nodes[info.id]["status"] = info.status
        for edge in data.get("edges", []):
            if edge.get("kind") != "merge":
                continue
            child, into = graph._require(edge["source"]), graph._require(edge["target"])
            graph._g.add_edge(
                child,
                into,
                kind="merge",
                strategy=edge.get("strategy", "facts"),
                conflict=edge.get("conflict", "newest"),
                count=int(edge.get("count", 1)),
                created_at=datetime.fromisoformat(edge["created_at"])
                if "created_at" in edge
                else datetime.now(UTC),
            )
        graph.version = 1
        return graph

    def _layout(self) -> dict[str, tuple[float, float]]:
        """A tidy tree layout of the fork forest: leaves side by side, parents centred."""
        pos: dict[str, tuple[float, float]] = {}
        next_x = 0.0

        def place(branch: str, depth: int) -> float:
            nonlocal next_x
            kids = self._children[branch]
            if not kids:
                x = next_x
                next_x += 1.0
            else:
                xs = [place(k, depth + 1) for k in kids]
                x = (xs[0] + xs[-1]) / 2
            pos[branch] = (x, -float(depth))
            return x

        for root in self.roots():
            place(root, 0)
            next_x += 0.5
        return pos

    def draw(self, ax: Axes | None = None) -> Figure:
        """Plot the graph (fork edges solid, merges dashed, colour by status).

        Returns the matplotlib figure (``ax.figure`` when ``ax`` is given).

        Raises:
            MissingDependencyError: matplotlib is not installed (the ``notebooks`` extra).
        """
        try:
            from matplotlib.figure import Figure  # noqa: PLC0415 (optional dependency: notebooks)
            from matplotlib.lines import Line2D  # noqa: PLC0415 (optional dependency: notebooks)
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingDependencyError(
                "BranchGraph.draw needs matplotlib: pip install 'marsys-mem[notebooks]'"
            ) from exc
        if ax is None:
            width = max(4.0, 1.6 * (len(self._parent) ** 0.5) * 2)
            fig = Figure(figsize=(width, max(3.0, 0.9 * width)))
            ax = fig.add_subplot()
        else:
            fig = ax.get_figure()  # type: ignore[assignment]
        pos = self._layout()
        nodes = list(self._parent)
        colors = [_COLORS[self._g.nodes[b]["status"]] for b in nodes]
        nx.draw_networkx_nodes(
            self._g,
            pos,
            nodelist=nodes,
            node_color=colors,
            ax=ax,
            node_size=2200,
            edgecolors="#333333",
        )
        labels = {b: f"{b}\n({len(self._agents[b])} agents)" for b in nodes}
        nx.draw_networkx_labels(self._g, pos, labels=labels, font_size=7, ax=ax)
        fork_edges = [(u, v) for u, v, k in self._g.edges(data="kind") if k == "fork"]
        merge_edges = [(u, v) for u, v, k in self._g.edges(data="kind") if k == "merge"]
        nx.draw_networkx_edges(
            self._g, pos, edgelist=fork_edges, ax=ax, arrows=True, node_size=2200, arrowstyle="-|>"
        )
        if merge_edges:
            nx.draw_networkx_edges(
                self._g,
                pos,
                edgelist=merge_edges,
                ax=ax,
                arrows=True,
                node_size=2200,
                style="dashed",
                edge_color="#2E7D32",
                arrowstyle="-|>",
                connectionstyle="arc3,rad=0.3",
            )
        handles = [
            Line2D([], [], marker="o", linestyle="", color=c, label=s, markersize=8)
            for s, c in _COLORS.items()
        ]
        handles.append(Line2D([], [], color="#333333", label="fork"))
        handles.append(Line2D([], [], color="#2E7D32", linestyle="--", label="merge"))
        ax.legend(handles=handles, loc="best", fontsize=7)
        ax.set_axis_off()
        ax.margins(0.2)
        if fig is None:  # pragma: no cover - an Axes always belongs to a figure
            raise ValueError("the axes belong to no figure")
        return fig

    def __html_view__(self, *, max_rows: int = MAX_ROWS, max_chars: int = MAX_CHARS) -> str:
        """The graph as a bounded HTML table (:class:`~marsys_mem.display.HtmlViewable`)."""
        return graph_html(self, max_rows=max_rows, max_chars=max_chars)

    def _repr_html_(self) -> str:
        return self.__html_view__()

    def __repr__(self) -> str:
        counts = {"active": 0, "merged": 0, "closed": 0}
        for b in self._parent:
            counts[self._g.nodes[b]["status"]] += 1
        return (
            f"BranchGraph(branches={len(self._parent)}, active={counts['active']}, "
            f"merged={counts['merged']}, closed={counts['closed']})"
        )
