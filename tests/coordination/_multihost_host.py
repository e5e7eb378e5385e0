"""One host of tests/coordination/test_multihost.py, run as its own process.

A host is what one machine of a team runs: a :class:`MemoryManager` made from a policy
file whose store is the shared PostgreSQL (:func:`policy_file`: the agent ``<host>`` is
persistent with RAG; the agent ``team``, written by every host, is persistent with
``max_stored_messages``) and a
:class:`Coordinator` on the shared MQTT broker. The test drives it by lines on stdin and
it answers by lines on stdout:

* the DSN comes from ``$MARSYS_MEM_PG_DSN`` (not the command line: ``ps`` shows that);
* it prints ``ready`` once connected to both;
* ``go``: it shares the fact ``fact-<host>`` (scope global), then appends, until ``stop``,
  one message to its agent and one to ``team`` per round; after each ``add`` returns
  it writes ``<agent> <message_id>`` to its ack file and fsyncs it;
* after ``stop``: it flushes (its vectors are in the store), prints ``wrote``;
* ``search <expected.json>``: for every agent and message id in the file, it searches the
  agent's RAG memory (opened over the shared store) for the message's token, writes what
  it did not find, the messages its embedder embedded, the facts it received and what
  each RAG memory held (messages, vectors, keyword documents) when opened and after the
  searches to ``<workdir>/<host>.result.json``, prints ``searched`` and exits. A host
  started late (after the others wrote) gets ``search`` without ``go``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marsys_mem.coordination import BranchGraph, Coordinator, MqttTransport
from marsys_mem.manager import MemoryManager
from marsys_mem.model.messages import Message
from marsys_mem.retrieval.embeddings import HashingEmbedder

TEAM_MAX = 10
"""``max_stored_messages`` of the agent ``team``."""

_WORDS = ("harbor", "copper", "violet", "meadow", "lantern", "orbit", "saffron", "glacier")
_MESSAGE = re.compile(r"^note tok([a-z0-9]+)x(\d+)x([a-z]+)\b")


def token(message_id: str) -> str:
    """The word only ``message_id``'s text contains (``h0-5`` -> ``tokh0x5xlog``)."""
    host, _, rest = message_id.partition("-")
    kind = "team" if rest.startswith("t") else "log"
    return f"tok{host}x{rest.lstrip('t')}x{kind}"


def text_of(message_id: str) -> str:
    """The message's text: its token first, then a few words that vary with it."""
    i = int(message_id.partition("-")[2].lstrip("t"))
    words = " ".join(_WORDS[(i * 3 + j) % len(_WORDS)] for j in range(3))
    return f"note {token(message_id)} about the {words} report"


def message_id_of(text: str) -> str | None:
    """The id of the message whose text this is (``None`` for a query)."""
    found = _MESSAGE.match(text)
    if found is None:
        return None
    host, i, kind = found.groups()
    return f"{host}-{'t' if kind == 'team' else ''}{i}"


class CountingEmbedder(HashingEmbedder):
    """A HashingEmbedder that remembers every text it embedded (same name: same vectors)."""

    def __init__(self) -> None:
        super().__init__(64)
        self.texts: list[str] = []
        self._count_lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> Any:
        with self._count_lock:
            self.texts.extend(texts)
        return super().embed(texts)


def policy_file(hosts: Sequence[str]) -> str:
    """Every host's policy file (YAML): the same agents everywhere, the store postgres
    with its DSN from ``$MARSYS_MEM_PG_DSN``."""
    lines = [
        "version: 1",
        "store: {backend: postgres, pool: {min: 1, max: 4}, connect_timeout: 10}",
        "agents:",
        f"  team: {{retention: persistent, max_stored_messages: {TEAM_MAX}}}",
    ]
    lines += [
        f"  {h}: {{retention: persistent, patterns: {{rag: true, embedder: default}}}}"
        for h in hosts
    ]
    return "\n".join(lines) + "\n"


def say(line: str) -> None:
    print(line, flush=True)


def write_until_stopped(
    manager: MemoryManager, name: str, acks: Path, stop: threading.Event
) -> int:
    """Append rounds until ``stop`` is set; log each append after it returned (fsync'd)."""
    mine, team = manager.memory(name), manager.memory("team")
    rounds = 0
    with acks.open("a") as log:
        while not stop.is_set():
            for agent, memory, mid in (
                (name, mine, f"{name}-{rounds}"),
                ("team", team, f"{name}-t{rounds}"),
            ):
                memory.add(Message.user(text_of(mid), message_id=mid))
                log.write(f"{agent} {mid}\n")
                log.flush()
                os.fsync(log.fileno())
            rounds += 1
            time.sleep(0.01)
    return rounds


def held(manager: MemoryManager, agents: Sequence[str]) -> dict[str, dict[str, Any]]:
    """What each agent's RAG memory holds on this host: its state, not timing."""
    out: dict[str, dict[str, Any]] = {}
    for agent in agents:
        patterns = manager.patterns(agent)
        assert patterns is not None
        assert patterns.rag is not None
        rag = patterns.rag
        out[agent] = {
            "stateless": rag.stateless,
            "messages": len(rag._messages),
            "vectors": len(rag._index) if rag._index is not None else 0,
            "keywords": len(rag._bm25),
        }
    return out


def search_all(manager: MemoryManager, expected: dict[str, list[str]]) -> dict[str, list[str]]:
    """The expected message ids each agent's RAG search did not return in its top 3."""
    missing: dict[str, list[str]] = {}
    for agent, ids in expected.items():
        patterns = manager.patterns(agent)
        assert patterns is not None
        assert patterns.rag is not None
        rag = patterns.rag
        missing[agent] = [
            mid
            for mid in ids
            # the default hybrid search (dense side from the shared vectors): the token is
            # the message's only distinctive word; the turn after a match inherits half
            # its keyword score as context, so the match may come second
            if mid not in [h.message.message_id for h in rag.search(token(mid), k=3)]
        ]
    return missing


async def run(args: argparse.Namespace) -> None:
    commands: queue.Queue[str] = queue.Queue()
    stop = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                stop.set()
            else:
                commands.put(line.strip())
        stop.set()  # the test is gone: an orphan host stops writing and exits
        commands.put("eof")

    threading.Thread(target=read_stdin, daemon=True).start()

    async def command() -> str:
        return await asyncio.to_thread(commands.get)

    name, workdir = args.name, Path(args.workdir)
    embedder = CountingEmbedder()
    manager = MemoryManager.from_config(args.policy, embedder=embedder)
    graph = BranchGraph()
    graph.add_branch("main", agents=[name])
    transport = MqttTransport(
        "127.0.0.1",
        args.mqtt_port,
        args.namespace,
        client_id=f"{args.namespace}-{name}",
        protocol=args.mqtt_protocol,
        connect_timeout=30,
    )
    try:
        async with Coordinator(graph, manager, transport) as coord:
            say("ready")
            line = await command()
            if line == "go":
                await coord.share(name, f"fact-{name}: {name} is online", scope="global")
                await asyncio.to_thread(
                    write_until_stopped, manager, name, workdir / f"{name}.acks", stop
                )
                await asyncio.to_thread(manager.flush)
                say("wrote")
                line = await command()
            if not line.startswith("search "):
                return
            expected = json.loads(Path(line.removeprefix("search ")).read_text())
            opened = await asyncio.to_thread(held, manager, sorted(expected))
            missing = await asyncio.to_thread(search_all, manager, expected)
            await asyncio.to_thread(manager.flush)
            embedded = [mid for mid in map(message_id_of, embedder.texts) if mid is not None]
            result = {
                "missing": missing,
                "searched": sum(len(ids) for ids in expected.values()),
                "embedded": embedded,
                "facts": sorted(f.text for f in coord.facts_for(name)),
                "held_at_open": opened,
                "held_after": held(manager, sorted(expected)),
            }
            (workdir / f"{name}.result.json").write_text(json.dumps(result))
            say("searched")
    finally:
        manager.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--policy", required=True, help="the policy file (policy_file)")
    parser.add_argument("--mqtt-port", type=int, required=True)
    parser.add_argument("--mqtt-protocol", default="5")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--workdir", required=True)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
