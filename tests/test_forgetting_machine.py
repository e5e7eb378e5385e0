"""State machine: after any sequence of adds, forgets, expiries, evictions and restarts,
no text whose message is gone comes back from any read path, and none forgotten or
expired stays on disk.

Every pattern is on (RAG, episodic, hierarchical, learned facts, cross-thread recall) and
shared facts are shared and forgotten; a second manager on the same store plays the other
process. Read paths checked after every step: ``context_for`` (with the token as the
query), every pattern's search, the fact memory, core memory, the second manager's
window, ``marsys-mem inspect`` and ``search``; the store's folder is grepped (WAL
included) for every forgotten or expired token.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from marsys_mem import MemoryManager, Message
from marsys_mem.cli.main import main as cli
from marsys_mem.config import load_config
from marsys_mem.testing.postgres import PostgresServer

BOUND = 6


def _token(n: int) -> str:
    letters = ""
    n += 26 * 26  # at least three letters: never a common word
    while n:
        n, r = divmod(n, 26)
        letters = chr(ord("a") + r) + letters
    return "Qx" + letters


class Forgetting(RuleBasedStateMachine):
    """One agent with every pattern, a bound and a ttl, on SQLite; a second process."""

    make_dsn: Callable[[], str] | None = None  # PostgreSQL: a fresh schema per machine

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="forget-machine-"))
        self.db = self.dir / "store" / "memory.db"
        store: dict[str, Any] = {"backend": "sqlite", "path": str(self.db)}
        if self.make_dsn is not None:
            store = {"backend": "postgres", "dsn": self.make_dsn()}
        data = {
            "version": 1,
            "store": store,
            "agents": {
                "a": {
                    "retention": "persistent",
                    "ttl": "1h",
                    "max_stored_messages": BOUND,
                    "patterns": {
                        "embedder": "hashing",
                        "rag": True,
                        "episodic": True,
                        "hierarchical": {"working_size": 2},
                        "facts": {"subject": "alice", "debounce": 30},
                    },
                }
            },
        }
        path = self.dir / "policy.yaml"
        path.write_text(yaml.safe_dump(data))
        self.config = load_config(path)
        self.manager = MemoryManager(self.config)
        self.other: MemoryManager | None = None
        self.count = 0
        self.ids: dict[str, str] = {}  # token -> message id
        self.old: set[str] = set()  # tokens whose message is older than the ttl
        self.dead: set[str] = set()  # forgotten or expired: gone from disk too
        self.facts: dict[str, str] = {}  # shared fact token -> fact id

    def teardown(self) -> None:
        for m in (self.manager, self.other):
            if m is not None:
                m.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ rules
    @rule(kind=st.sampled_from(["note", "name", "home"]), old=st.booleans())
    def add(self, kind: str, old: bool) -> None:
        token = _token(self.count)
        self.count += 1
        text = {
            "note": f"note {token} about the harbour",
            "name": f"Hi, my name is {token}.",
            "home": f"I live in {token}.",
        }[kind]
        when = datetime.now(UTC) - timedelta(hours=2) if old else datetime.now(UTC)
        mid = self.manager.memory("a").add(Message.user(text, timestamp=when))
        self.ids[token] = mid
        if old:
            self.old.add(token)

    @rule()
    def learn(self) -> None:
        patterns = self.manager.patterns("a")
        assert patterns is not None
        self.manager.flush()

    @precondition(lambda self: bool(self.live()))
    @rule(data=st.data())
    def forget_one(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(sorted(self.live())))
        self.manager.forget("a", message_ids=[self.ids[token]])
        self.dead.add(token)

    @rule()
    def forget_everything(self) -> None:
        self.manager.forget("a", everything=True)
        self.dead |= set(self.ids)

    @rule()
    def expire(self) -> None:
        self.manager.apply_retention()
        self.dead |= self.old

    @rule()
    def restart(self) -> None:
        self.manager.close()
        self.manager = MemoryManager(self.config)

    @rule()
    def other_process(self) -> None:
        if self.other is None:
            self.other = MemoryManager(self.config)
        self.other.memory("a")

    @rule()
    def share(self) -> None:
        token = _token(self.count)
        self.count += 1
        fact = self.manager.shared.share_insight("a", f"The code word is {token}")
        self.facts[token] = fact.id

    @precondition(lambda self: bool(set(self.facts) - self.dead))
    @rule(data=st.data())
    def forget_shared(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(sorted(set(self.facts) - self.dead)))
        self.manager.forget_shared([self.facts[token]])
        self.dead.add(token)

    # ------------------------------------------------------------------ model
    def stored_ids(self) -> set[str]:
        return {m.message_id for m in self.manager.store.load_messages(self.manager.key("a"))}

    def live(self) -> set[str]:
        """Tokens whose message is stored and alive (an old one has outlived the ttl: the
        next read of the memory deletes it, so it cannot be forgotten by id any more)."""
        stored = self.stored_ids()
        return {
            t
            for t, mid in self.ids.items()
            if mid in stored and t not in self.dead and t not in self.old
        }

    def gone(self) -> set[str]:
        """Tokens whose message is no longer stored (forgotten, expired or evicted)."""
        stored = self.stored_ids()
        return {t for t, mid in self.ids.items() if mid not in stored} | (
            self.dead & set(self.facts)
        )

    # ------------------------------------------------------------------ invariants
    @invariant()
    def nothing_gone_comes_back(self) -> None:
        gone = self.gone()
        if not gone:
            return
        manager = self.manager
        patterns = manager.patterns("a")
        assert patterns is not None
        facts = manager.fact_memory("hashing")
        for token in sorted(gone)[-4:]:  # the newest few: each read path per step
            seen = [m.text for m in manager.context_for("a", f"{token} harbour").messages]
            seen += [h.message.text for h in patterns.search_all(token)]
            seen += [f.text for f in facts.facts("alice")]
            if patterns.hierarchical is not None:
                seen += [m.text for m in patterns.hierarchical.core()]
            if self.other is not None:
                seen += [m.text for m in self.other.context_for("a", token).messages]
            leaked = [s for s in seen if token in s]
            assert not leaked, f"{token} is gone but a read path returned {leaked}"

    @invariant()
    def the_cli_does_not_show_it(self) -> None:
        gone = self.gone()
        if not gone or not self.db.exists():
            return
        out = io.StringIO()
        query = " ".join(sorted(gone)[-3:])
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            cli(["inspect", str(self.db)])
            cli(["search", "--mode", "bm25", "--json", str(self.db), query])
        shown = out.getvalue().replace(query, "")  # the query is echoed
        assert not [t for t in gone if t in shown]

    @invariant()
    def forgotten_is_gone_from_disk(self) -> None:
        if not self.dead or not self.db.exists():
            return
        for path in self.db.parent.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                held = [t for t in self.dead if t.encode() in data]
                assert not held, f"{path.name} still holds {held}"


Forgetting.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=16,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestForgetting = pytest.mark.filterwarnings("ignore::ResourceWarning")(Forgetting.TestCase)


class ForgettingOnPostgres(Forgetting):
    """The same machine on PostgreSQL (the files are the server's: not grepped)."""

    def __init__(self) -> None:
        assert self.make_dsn is not None, "the _postgres_schemas fixture sets make_dsn"
        super().__init__()
        assert self.manager.config.store.backend == "postgres"


@pytest.fixture
def _postgres_schemas(postgres_server: PostgresServer) -> Iterator[None]:
    names = iter(range(10**6))
    ForgettingOnPostgres.make_dsn = staticmethod(
        lambda: postgres_server.create_schema(f"forget{next(names)}")
    )
    yield
    ForgettingOnPostgres.make_dsn = None


ForgettingOnPostgres.TestCase.settings = settings(
    max_examples=8,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestForgettingOnPostgres = pytest.mark.usefixtures("_postgres_schemas")(
    pytest.mark.filterwarnings("ignore::ResourceWarning")(ForgettingOnPostgres.TestCase)
)
