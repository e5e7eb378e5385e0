"""Several hosts, one PostgreSQL, one MQTT broker: nothing acknowledged is lost or doubled.

Three processes (``_multihost_host.py``), each with its own MemoryManager, PostgresStore
pool and Coordinator, as three machines would run them, share one PostgreSQL (started
here: initdb + pg_ctl) and one mosquitto (the session broker of conftest.py). While they
append, PostgreSQL crashes and restarts (``pg_ctl stop -m immediate``), and later one host
is SIGKILLed mid-write. Then:

* every acknowledged message is stored exactly once, in its host's ack order, under its
  agent's key and its RAG key (the killed host: at most its one in-flight append more);
* the key every host writes (``team``, ``max_stored_messages``) holds the bound, and what
  it keeps of each host is the newest of what that host appended;
* every message has exactly one stored vector, and a surviving host never embedded a
  message another surviving host had embedded (vectors are shared through the store);
* each surviving host's search finds every message of every host (one catch-up), and it
  received the facts every host shared over MQTT, the killed one's included;
* a host started after all that searches too, and finds every message.

It runs twice: on the machine's PostgreSQL (no pgvector: each host keeps a faiss copy of
the vectors and catches up by cursor) and on PostgreSQL with pgvector, where the database
searches and the hosts are stateless: no host holds a message, a vector or a keyword
document, before or after its searches, and the late host embeds nothing but its queries.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from marsys_mem.store.keys import internal_key
from marsys_mem.store.postgres import PostgresStore
from marsys_mem.testing.postgres import PostgresServer, require_pgvector, require_postgres

HOST_SCRIPT = Path(__file__).with_name("_multihost_host.py")
_spec = importlib.util.spec_from_file_location("_multihost_host", HOST_SCRIPT)
assert _spec is not None
assert _spec.loader is not None
_host_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_host_module)
policy_file = _host_module.policy_file
TEAM_MAX: int = _host_module.TEAM_MAX
MODEL: str = _host_module.CountingEmbedder().name  # the model the vectors are stored under
HOSTS = ("h0", "h1", "h2")
VICTIM = "h2"
LATE = "late"  # started after the others wrote: it only searches
NAMESPACE = "default"  # the managers' store namespace
MQTT_NAMESPACE = "multihost"
PHASE_TIMEOUT = 45.0


class Host:
    """A host process: commands on its stdin, its stdout lines read by a thread."""

    def __init__(self, name: str, workdir: Path, dsn: str, broker_port: int, protocol: str):
        self.name = name
        self.acks = workdir / f"{name}.acks"
        self.result = workdir / f"{name}.result.json"
        self.log = workdir / f"{name}.log"
        self.lines: queue.Queue[str] = queue.Queue()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "MARSYS_MEM_PG_DSN": dsn}  # not in ps
        with self.log.open("wb") as errors:
            self.proc = self._spawn(name, workdir, dsn, broker_port, protocol, errors, env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @staticmethod
    def _spawn(
        name: str,
        workdir: Path,
        dsn: str,
        broker_port: int,
        protocol: str,
        errors: IO[bytes],
        env: dict[str, str],
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable,
                str(HOST_SCRIPT),
                f"--name={name}",
                f"--policy={workdir / 'policy.yaml'}",
                f"--mqtt-port={broker_port}",
                f"--mqtt-protocol={protocol}",
                f"--namespace={MQTT_NAMESPACE}",
                f"--workdir={workdir}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=env,
        )

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, wanted: str, timeout: float = PHASE_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=min(max(left, 0.01), 0.5))
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    pytest.fail(f"{self.name} exited ({self.proc.returncode})\n{self.stderr()}")
                if left <= 0:
                    pytest.fail(
                        f"{self.name} did not say {wanted!r} in {timeout} s\n{self.stderr()}"
                    )
                continue
            if line == wanted:
                return

    def acked(self) -> list[tuple[str, str]]:
        """``(agent, message_id)`` of every complete line of the ack file."""
        try:
            text = self.acks.read_text()
        except FileNotFoundError:
            return []
        return [
            tuple(line.split()) for line in text.splitlines(keepends=True) if line.endswith("\n")
        ]  # type: ignore[misc]

    def wait_acks(self, count: int, timeout: float = PHASE_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked()) < count:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited ({self.proc.returncode})\n{self.stderr()}")
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{self.name} acked {len(self.acked())} < {count} in {timeout} s\n"
                    f"{self.stderr()}"
                )
            time.sleep(0.02)

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture(scope="module", params=["faiss", "pgvector"])
def pg_server(request: pytest.FixtureRequest) -> Iterator[PostgresServer]:
    """A PostgreSQL of this module's own (the test crashes and restarts it): the machine's
    (no pgvector: search on the hosts), or the pgvector wheel's (search in the database)."""
    bin_dir = require_pgvector() if request.param == "pgvector" else require_postgres()
    with PostgresServer(bin_dir=bin_dir, settings={"fsync": "off"}) as server:
        yield server


@pytest.mark.slow
def test_three_hosts_share_postgres_and_mqtt(
    pg_server: PostgresServer, mqtt_broker, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()

    def phase(what: str) -> None:  # shown when the test fails: where the time went
        print(f"{time.monotonic() - started:6.1f} s  {what}")

    dsn = pg_server.create_database("team")
    in_database = request.node.callspec.params["pg_server"] == "pgvector"
    if in_database:
        pg_server.execute("CREATE EXTENSION vector SCHEMA public", database="team")
    (tmp_path / "policy.yaml").write_text(policy_file(HOSTS))
    hosts = {h: Host(h, tmp_path, dsn, mqtt_broker.port, mqtt_broker.protocol) for h in HOSTS}
    try:
        for host in hosts.values():
            host.expect("ready", timeout=60)
        phase("3 hosts ready")
        for host in hosts.values():
            host.send("go")
        for host in hosts.values():
            host.wait_acks(20)
        pg_server.restart(mode="immediate")  # a crash mid-stream; recovery on start
        at_restart = {h: len(host.acked()) for h, host in hosts.items()}
        phase(f"PostgreSQL restarted; acks so far {at_restart}")
        for h, host in hosts.items():
            host.wait_acks(at_restart[h] + 20)  # every host got through the restart
        os.kill(hosts[VICTIM].proc.pid, signal.SIGKILL)  # mid-write: it never stops on its own
        hosts[VICTIM].proc.wait(10)
        phase(f"{VICTIM} killed after {len(hosts[VICTIM].acked())} acks")
        survivors = [host for h, host in hosts.items() if h != VICTIM]
        for host in survivors:
            host.wait_acks(len(host.acked()) + 10)
            host.send("stop")
        for host in survivors:
            host.expect("wrote")
        phase("survivors stopped writing and flushed")

        acked = {h: host.acked() for h, host in hosts.items()}
        with PostgresStore(dsn, max_size=2) as store:
            victim_rag = internal_key((NAMESPACE, VICTIM, "main"), "rag")
            had_vector = set(store.load_vectors(victim_rag, MODEL).message_ids)
            expected = {h: [mid for agent, mid in acked[h] if agent == h] for h in HOSTS}
            (tmp_path / "expected.json").write_text(json.dumps(expected))
            for host in survivors:
                host.send(f"search {tmp_path / 'expected.json'}")
            for host in survivors:
                host.expect("searched")
                assert host.proc.wait(30) == 0, host.stderr()
            phase("survivors searched")
            hosts[LATE] = late = Host(LATE, tmp_path, dsn, mqtt_broker.port, mqtt_broker.protocol)
            late.expect("ready", timeout=60)
            late.send(f"search {tmp_path / 'expected.json'}")
            late.expect("searched")
            assert late.proc.wait(30) == 0, late.stderr()
            phase("the late host searched")

            for h in HOSTS:
                _check_agent_keys(store, h, expected[h], exact=h != VICTIM)
            _check_team(store, acked)
            results = {host.name: json.loads(host.result.read_text()) for host in survivors}
            _check_results(results, expected, had_vector)
            late_result = json.loads(late.result.read_text())
            _check_late(late_result, expected, had_vector)
            if in_database:
                for name, result in [*results.items(), (LATE, late_result)]:
                    _check_stateless(name, result)
    finally:
        for host in hosts.values():
            host.stop()


def _check_agent_keys(store: PostgresStore, host: str, acked: list[str], *, exact: bool) -> None:
    """Every acked message once, in ack order, under the agent's key and RAG key, with one
    vector each; the killed host may have one more (its in-flight append)."""
    key = (NAMESPACE, host, "main")
    for where in (key, internal_key(key, "rag")):
        stored = [m.message_id for m in store.load_messages(where)]
        assert len(stored) == len(set(stored)), f"{where}: a message stored twice"
        assert store.count_messages(where) == len(stored)
        assert [mid for mid in stored if mid in set(acked)] == acked, f"{where}: lost or reordered"
        extra = [mid for mid in stored if mid not in set(acked)]
        if exact:
            assert extra == [], f"{where}: unacknowledged messages {extra}"
        else:
            assert extra in ([], [f"{host}-{len(acked)}"]), f"{where}: unexpected {extra}"
    rag = internal_key(key, "rag")
    vectors = store.load_vectors(rag, MODEL)
    assert Counter(vectors.message_ids) == Counter(m.message_id for m in store.load_messages(rag))


def _check_team(store: PostgresStore, acked: dict[str, list[tuple[str, str]]]) -> None:
    """The shared, bounded key: the bound holds, and each host's part is its newest, in order."""
    team = [m.message_id for m in store.load_messages((NAMESPACE, "team", "main"))]
    assert len(team) == len(set(team)) == TEAM_MAX
    for h, lines in acked.items():
        mine = [mid for agent, mid in lines if agent == "team"]
        kept = [mid for mid in team if mid.startswith(f"{h}-")]
        if h == VICTIM and kept and kept[-1] == f"{h}-t{len(mine)}":
            kept = kept[:-1]  # its in-flight append committed before the kill
        assert kept == mine[len(mine) - len(kept) :], f"team keeps {kept} of {h}'s {mine[-12:]}"


def _check_results(
    results: dict[str, dict[str, object]], expected: dict[str, list[str]], had_vector: set[str]
) -> None:
    """Searches found everything; no survivor embedded another survivor's message; facts."""
    everything = sum(len(ids) for ids in expected.values())
    victim_ids = set(expected[VICTIM]) | {f"{VICTIM}-{len(expected[VICTIM])}"}
    for name, result in results.items():
        assert result["searched"] == everything
        assert result["missing"] == {h: [] for h in HOSTS}, f"{name}'s search missed some"
        embedded = Counter(result["embedded"])  # type: ignore[arg-type]
        own = [mid for mid in embedded if mid.startswith(f"{name}-")]
        assert sorted(own) == sorted(expected[name]), f"{name} did not embed its own once"
        assert all(embedded[mid] == 1 for mid in own), f"{name} embedded a message twice"
        foreign = set(embedded) - set(own)
        assert foreign <= victim_ids - had_vector, (
            f"{name} embedded messages whose vectors were in the store: "
            f"{sorted(foreign - (victim_ids - had_vector))}"
        )
        assert result["facts"] == sorted(f"fact-{h}: {h} is online" for h in HOSTS)


def _check_late(
    result: dict[str, object], expected: dict[str, list[str]], had_vector: set[str]
) -> None:
    """The late host found every message; it embedded none a live host had embedded."""
    assert result["searched"] == sum(len(ids) for ids in expected.values())
    assert result["missing"] == {h: [] for h in HOSTS}, "the late host's search missed some"
    victim_ids = set(expected[VICTIM]) | {f"{VICTIM}-{len(expected[VICTIM])}"}
    assert set(result["embedded"]) <= victim_ids - had_vector  # type: ignore[arg-type]


def _check_stateless(name: str, result: dict[str, object]) -> None:
    """On pgvector a host holds nothing of the store, opened or after its searches, and
    embeds only its own messages (and its queries)."""
    nothing = {"stateless": True, "messages": 0, "vectors": 0, "keywords": 0}
    for when in ("held_at_open", "held_after"):
        held = result[when]
        assert held == {h: nothing for h in HOSTS}, f"{name} {when}: {held}"
    embedded = result["embedded"]
    assert all(mid.startswith(f"{name}-") for mid in embedded), f"{name} embedded {embedded}"  # type: ignore[union-attr]
