"""Shared-fact broadcast: latency and throughput, in process and through a real mosquitto.

Run it (about 45 s on a 2-core machine; ``--quick``: about 15 s)::

    python benchmarks/bench_coordination.py          # needs mosquitto on PATH or /usr/sbin
    python benchmarks/bench_coordination.py --quick

The script starts its own mosquitto on a free loopback port (a generated config in a
temporary folder, no persistence) and stops it at the end.

Setup: one sending coordinator whose graph holds the sender, and one receiving
coordinator whose graph holds 10 or 100 agents on the same branch (two agent groups, as
two processes would have; here both run in one event loop, as the raw clients do). A fact
is "delivered" when the receiving coordinator has put it in the inbox of its last agent
(an ``on_fact`` callback on that agent records the time).

* **Latency**: one fact at a time, ``share()`` start to delivery to all agents; p50 and p99.
* **Throughput**: facts shared back to back (at most 64 unacknowledged at once), facts per
  second until the last one reached every agent.
* **Floor**: raw aiomqtt between two clients on the same broker in the same run: QoS 1
  publishes of a payload the size of a fact envelope, same window of 64, until the
  subscriber has them all; and one-at-a-time publish-to-receipt latency. Both protocol
  versions are measured: paho decodes MQTT 5 properties on every packet, so the MQTT 5
  floor is lower. Our MQTT throughput is shown as a ratio to the floor of the same
  protocol (1.00 = as fast as bare aiomqtt); MqttTransport defaults to MQTT 5.
* **Rounds**: everything runs ``--rounds`` times (default 3), interleaved, so drift on a
  shared machine hits floors and coordinators alike; latencies are pooled, throughputs and
  ratios (each to its own round's floor) are medians.

Targets (issue 5): in process p50 < 0.2 ms; through mosquitto p50 < 3 ms and at least 50%
of raw aiomqtt throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiomqtt

from marsys_mem.coordination import (
    BranchGraph,
    Coordinator,
    FactDelivery,
    InProcessBroker,
    InProcessTransport,
    MqttTransport,
)
from marsys_mem.patterns.shared import SharedMemoryPool

WINDOW = 64


# ---------------------------------------------------------------------------- broker
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mosquitto() -> AsyncIterator[int]:  # type: ignore[misc]
    exe = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if os.access("/usr/sbin/mosquitto", os.X_OK) else None
    )
    if exe is None:
        sys.exit("mosquitto is not installed (apt-get install -y mosquitto)")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "mosquitto.conf"
        lines = [f"listener {port} 127.0.0.1", "allow_anonymous true", "persistence false",
                 "max_queued_messages 1000000", "max_inflight_messages 0", "log_type error"]
        if os.geteuid() == 0:
            lines.append("user root")
        conf.write_text("\n".join(lines) + "\n")
        proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        sys.exit("mosquitto did not start")
                    time.sleep(0.02)
            yield port
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)


def version_of(exe: str) -> str:
    try:
        out = subprocess.run([exe, "-h"], capture_output=True, text=True, timeout=5).stdout
        return out.splitlines()[0].strip()
    except (OSError, IndexError, subprocess.SubprocessError):
        return "mosquitto"


# ---------------------------------------------------------------------------- measuring
@dataclass
class Row:
    """One line of the results table."""

    name: str
    agents: str
    p50_ms: float
    p99_ms: float
    per_s: float
    ratio: str = ""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def bench_coordinators(
    make_transport: Callable[[str], object], agents: int, n_latency: int, n_throughput: int,
) -> tuple[list[float], float]:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    sender_graph = BranchGraph()
    sender_graph.add_branch("main", agents=["sender"])
    receiver_graph = BranchGraph()
    names = [f"agent-{i}" for i in range(agents)]
    receiver_graph.add_branch("main", agents=names)
    sender = Coordinator(sender_graph, transport=make_transport(namespace),  # type: ignore[arg-type]
                         pool=SharedMemoryPool(max_facts=100_000))
    receiver = Coordinator(receiver_graph, transport=make_transport(namespace),  # type: ignore[arg-type]
                           pool=SharedMemoryPool(max_facts=100_000))
    arrived: dict[str, float] = {}
    waiters: dict[str, asyncio.Future[None]] = {}

    def on_last(delivery: FactDelivery) -> None:
        arrived[delivery.fact.text] = time.perf_counter()
        fut = waiters.pop(delivery.fact.text, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    receiver.on_fact(on_last, agent=names[-1])
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    async with sender, receiver:
        for i in range(n_latency + 20):  # 20 warm-up facts
            text = f"latency fact {i}"
            waiters[text] = loop.create_future()
            start = time.perf_counter()
            await sender.share("sender", text)
            async with asyncio.timeout(10):
                await waiters[text] if text in waiters else None
            if i >= 20:
                latencies.append((arrived[text] - start) * 1000)
        gc.collect()
        texts = [f"throughput fact {i}" for i in range(n_throughput)]
        window = asyncio.Semaphore(WINDOW)
        last = texts[-1]
        waiters[last] = loop.create_future()

        async def one(text: str) -> None:
            async with window:
                await sender.share("sender", text)

        start = time.perf_counter()
        await asyncio.gather(*(one(t) for t in texts))
        async with asyncio.timeout(60):
            await waiters[last] if last in waiters else None
        elapsed = arrived[last] - start
        got = receiver.facts_for(names[-1])
        assert len(got) == n_latency + 20 + n_throughput, len(got)
        assert [f.text for f in got[-n_throughput:]] == texts, "out of order"
    return latencies, n_throughput / elapsed


async def bench_raw(port: int, n_latency: int, n_throughput: int, size: int,
                    protocol: str) -> tuple[list[float], float]:
    topic = f"raw/{uuid.uuid4().hex[:8]}"
    payload = b"x" * size
    version = aiomqtt.ProtocolVersion.V5 if protocol == "5" else aiomqtt.ProtocolVersion.V311
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"pub-{uuid.uuid4().hex[:8]}",
                              max_inflight_messages=100, protocol=version) as pub, \
            aiomqtt.Client("127.0.0.1", port, identifier=f"sub-{uuid.uuid4().hex[:8]}",
                           max_inflight_messages=100, protocol=version) as sub:
        pub.pending_calls_threshold = 1_000_000  # a full window is expected, not a warning
        await sub.subscribe(topic, qos=1)
        messages = sub.messages
        latencies: list[float] = []
        for i in range(n_latency + 20):
            start = time.perf_counter()
            await pub.publish(topic, payload, qos=1)
            async with asyncio.timeout(10):
                await anext(messages)
            if i >= 20:
                latencies.append((time.perf_counter() - start) * 1000)
        window = asyncio.Semaphore(WINDOW)

        async def one() -> None:
            async with window:
                await pub.publish(topic, payload, qos=1)

        async def receive_all() -> float:
            count = 0
            async for _ in messages:
                count += 1
                if count == n_throughput:
                    return time.perf_counter()
            raise RuntimeError("subscriber stopped")

        start = time.perf_counter()
        receiver = asyncio.ensure_future(receive_all())
        await asyncio.gather(*(one() for _ in range(n_throughput)))
        async with asyncio.timeout(60):
            end = await receiver
    return latencies, n_throughput / (end - start)


def envelope_size() -> int:
    from marsys_mem.coordination import FactEnvelope
    from marsys_mem.model.facts import SharedFact

    fact = SharedFact.create("throughput fact 1234", agent="sender")
    env = FactEnvelope(namespace="bench-12345678", sender=f"coord-{uuid.uuid4().hex}", seq=1234,
                       branch="main", scope="branch", fact=fact)
    return len(env.model_dump_json().encode())


async def main(quick: bool, rounds: int) -> int:
    n_lat = 200 if quick else 1000
    n_thr = 1000 if quick else 5000
    rows: list[Row] = []
    size = envelope_size()
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    print(f"# Shared-fact broadcast ({platform.python_version()}, {os.cpu_count()} cores, "
          f"aiomqtt {aiomqtt.__version__}, {version_of(exe)})\n")
    print(f"latency: {n_lat} facts one at a time; throughput: {n_thr} facts, window {WINDOW}; "
          f"envelope {size} bytes\n")
    # every measurement runs `rounds` times, interleaved, so drift on a shared machine hits
    # the floors and the coordinators alike; latencies are pooled, throughputs and ratios
    # (to the floor of the same protocol in the same round) are medians over the rounds
    lat: dict[tuple[str, int], list[float]] = {}
    rates: dict[tuple[str, int], list[float]] = {}
    ratios: dict[tuple[str, int], list[float]] = {}

    def record(key: tuple[str, int], result: tuple[list[float], float]) -> None:
        lat.setdefault(key, []).extend(result[0])
        rates.setdefault(key, []).append(result[1])

    with mosquitto() as port:
        for _ in range(rounds):
            for agents in (10, 100):
                broker = InProcessBroker()
                record(("in process", agents), await bench_coordinators(
                    lambda ns, b=broker: InProcessTransport(b, namespace=ns), agents, n_lat, n_thr
                ))
            for protocol in ("5", "3.1.1"):
                floor = await bench_raw(port, n_lat, n_thr, size, protocol)
                record((f"raw {protocol}", 1), floor)
                for agents in (10, 100):
                    key = (f"MQTT {protocol}", agents)
                    record(key, await bench_coordinators(
                        lambda ns, p=port, v=protocol: MqttTransport(  # type: ignore[misc]
                            "127.0.0.1", p, ns, client_id=f"c-{uuid.uuid4().hex[:12]}",
                            protocol=v,
                        ),
                        agents, n_lat, n_thr,
                    ))
                    ratios.setdefault(key, []).append(rates[key][-1] / floor[1])
    for key, values in lat.items():
        name, agents = key
        rate = statistics.median(rates[key])
        if name.startswith("raw"):
            label, who, ratio = f"raw aiomqtt pub/sub, MQTT {name[4:]} (floor)", "1 client", "1.00"
        elif name.startswith("MQTT"):
            label, who = f"Coordinator, mosquitto, {name}", str(agents)
            ratio = f"{statistics.median(ratios[key]):.2f}"
        else:
            label, who, ratio = f"Coordinator, {name}", str(agents), ""
        rows.append(Row(label, who, statistics.median(values), pct(values, 0.99), rate, ratio))
    print("| transport | agents | p50 latency | p99 latency | throughput "
          "| vs raw aiomqtt, same protocol |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.name} | {r.agents} | {r.p50_ms:.3f} ms | {r.p99_ms:.3f} ms | "
              f"{r.per_s:,.0f} facts/s | {r.ratio} |")
    print("\n## Targets\n")
    failed = False

    def check(ok: bool, text: str) -> None:
        nonlocal failed
        failed |= not ok
        print(f"{'PASS' if ok else 'FAIL'}: {text}")

    for agents in (10, 100):
        p50 = statistics.median(lat[("in process", agents)])
        check(p50 < 0.2, f"in process, {agents} agents: p50 {p50:.3f} ms < 0.2 ms")
    for protocol in ("5", "3.1.1"):
        for agents in (10, 100):
            key = (f"MQTT {protocol}", agents)
            p50 = statistics.median(lat[key])
            ratio = statistics.median(ratios[key])
            check(p50 < 3.0, f"MQTT {protocol}, {agents} agents: p50 {p50:.3f} ms < 3 ms")
            check(ratio >= 0.5, f"MQTT {protocol}, {agents} agents: throughput "
                  f"{ratio:.0%} of raw aiomqtt on the same protocol (median of {rounds}) >= 50%")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer facts (about 20 s)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    args = parser.parse_args()
    started = time.perf_counter()
    code = asyncio.run(main(args.quick, args.rounds))
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    sys.exit(code)
