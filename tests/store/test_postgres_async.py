"""PostgresStore's async twins on psycopg's async pool: the sync path's semantics, no threads.

Real PostgreSQL (tests/store/conftest.py), real faults: a restart, a crash, a COMMIT whose
answer is cut by a loopback proxy (``CommitCutter`` of test_postgres.py), a lock held by
another session.
"""

import asyncio
import threading
import time

import psycopg
import pytest

from marsys_mem.exceptions import DuplicateMessageError, StoreConnectionError, StoreError
from marsys_mem.model.messages import Message
from marsys_mem.store.base import Append, CountMessages, Load
from marsys_mem.store.postgres import PostgresStore
from marsys_mem.testing.conformance import KEY, message_ids, user_messages
from marsys_mem.testing.postgres import PostgresServer
from tests.store.test_postgres import CommitCutter, _with_port

pytestmark = pytest.mark.slow


def _key(i: int) -> tuple[str, str, str]:
    return ("default", f"a{i}", "main")


def test_async_twins_run_on_the_event_loop_not_in_threads(postgres_dsn: str) -> None:
    """Before: every async twin ran the sync batch in ``asyncio.to_thread`` (threads named
    asyncio_N appeared). Now 200 concurrent appends and loads run on the loop's async pool."""
    with PostgresStore(postgres_dsn, max_size=4) as store:

        async def scenario() -> set[str]:
            before = {t.ident for t in threading.enumerate()}
            await asyncio.gather(
                *(
                    store.aappend_messages(_key(i % 5), user_messages(1, prefix=f"x{i}-"))
                    for i in range(100)
                )
            )
            loads = await asyncio.gather(*(store.aload_messages(_key(i % 5)) for i in range(100)))
            assert all(len(found) == 20 for found in loads)
            page = await store.aload_messages_after(_key(0))
            assert page.count == 20
            assert await store.aenforce_retention(_key(0), max_messages=5) == 15
            return {t.name for t in threading.enumerate() if t.ident not in before}

        started = asyncio.run(scenario())
        assert not started, f"threads started by the async twins: {sorted(started)}"
        assert store.count_messages(_key(0)) == 5
        assert sum(store.count_messages(_key(i)) for i in range(1, 5)) == 80


def test_a_lock_wait_is_bounded_and_the_loop_keeps_running(postgres_dsn: str) -> None:
    """The async path sets the sync path's lock/statement timeouts per transaction."""
    with PostgresStore(postgres_dsn, retry_timeout=2) as store:
        store.append_messages(KEY, user_messages(1))
        with psycopg.connect(postgres_dsn, autocommit=False) as blocker:
            blocker.execute("LOCK TABLE marsys_messages IN ACCESS EXCLUSIVE MODE")

            async def scenario() -> int:
                ticks = 0

                async def ticker() -> None:
                    nonlocal ticks
                    while True:
                        await asyncio.sleep(0.05)
                        ticks += 1

                task = asyncio.get_running_loop().create_task(ticker())
                with pytest.raises(StoreError, match=r"waited past its 2 s .*lock_timeout"):
                    await store.aappend_messages(KEY, user_messages(1, prefix="late"))
                task.cancel()
                return ticks

            started = time.monotonic()
            ticks = asyncio.run(scenario())
            assert time.monotonic() - started < 6
            assert ticks >= 20  # the loop ran other tasks while the batch waited
            blocker.rollback()
        assert asyncio.run(store.aload_messages(KEY)) == store.load_messages(KEY)
        assert message_ids(store.load_messages(KEY)) == ["m0"]


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_server_restart_costs_async_retries_not_data(
    postgres_server: PostgresServer, postgres_dsn: str, mode: str
) -> None:
    """Concurrent async batches (two keys each) while the server restarts or crashes."""
    shared = ("default", "shared", "main")
    with PostgresStore(postgres_dsn, max_size=4, retry_timeout=60) as store:
        acked: dict[int, list[str]] = {t: [] for t in range(4)}

        async def work(t: int) -> None:
            for i in range(60):
                msgs = tuple(user_messages(1, prefix=f"t{t}-{i}-"))
                await store.abatch([Append(_key(t), msgs), Append(shared, msgs)])
                acked[t].append(msgs[0].message_id)

        async def scenario() -> None:
            tasks = [asyncio.create_task(work(t)) for t in range(4)]
            while sum(len(a) for a in acked.values()) < 40:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(postgres_server.restart, mode)  # type: ignore[arg-type]
            await asyncio.gather(*tasks)  # none raised: retries outlast a restart

        asyncio.run(scenario())
        everything = message_ids(store.load_messages(shared))
        assert len(everything) == len(set(everything)) == 240
        for t in range(4):
            assert message_ids(store.load_messages(_key(t))) == acked[t]  # once, in order


@pytest.mark.parametrize("mode", ["after", "before"])
def test_an_async_commit_without_answer_is_checked_not_rerun(
    postgres_server: PostgresServer, postgres_dsn: str, mode: str
) -> None:
    cutter = CommitCutter(postgres_server.port)
    try:
        dsn = _with_port(postgres_dsn, cutter.port) + "&sslmode=disable"
        with PostgresStore(dsn, max_size=2) as store:

            async def scenario() -> None:
                await store.aappend_messages(KEY, user_messages(2))
                cutter.arm(mode)
                batch = tuple(user_messages(3, prefix="x"))
                await store.abatch([Append(KEY, batch), Append(_key(9), batch)])
                assert cutter.cuts == 1
                found = await store.abatch([Load(KEY), CountMessages(_key(9))])
                assert message_ids(found[0]) == ["m0", "m1", "x0", "x1", "x2"]
                assert found[1] == 3
                with pytest.raises(DuplicateMessageError):  # the retry did not append twice
                    await store.aappend_messages(KEY, batch[:1])

            asyncio.run(scenario())
    finally:
        cutter.close()


def test_cancelled_batches_and_several_event_loops(postgres_dsn: str) -> None:
    """A task cancelled while its batch waits commits nothing and gives its connection
    back; one store serves several ``asyncio.run`` loops; closing it is clean."""
    store = PostgresStore(postgres_dsn, max_size=2, retry_timeout=30)
    store.append_messages(KEY, user_messages(1))
    with psycopg.connect(postgres_dsn, autocommit=False) as blocker:
        blocker.execute("LOCK TABLE marsys_messages IN ACCESS EXCLUSIVE MODE")

        async def cancel_waiting() -> None:
            tasks = [
                asyncio.create_task(
                    store.aappend_messages(KEY, [Message.user("no", message_id=f"c{i}")])
                )
                for i in range(2)  # both pool connections wait on the lock
            ]
            await asyncio.sleep(0.5)
            for task in tasks:
                task.cancel()
            for task in tasks:
                with pytest.raises(asyncio.CancelledError):
                    await task

        asyncio.run(cancel_waiting())
        blocker.rollback()

    async def after() -> list[str]:  # a new loop: its own pool; both connections usable
        await asyncio.gather(*(store.aappend_messages(_key(i), user_messages(1)) for i in range(4)))
        return message_ids(await store.aload_messages(KEY))

    assert asyncio.run(after()) == ["m0"]
    assert asyncio.run(store.acount_messages(_key(3))) == 1
    store.close()
    with pytest.raises(StoreError, match="closed"):
        asyncio.run(store.aload_messages(KEY))


def test_a_server_that_stays_away_raises_after_retry_timeout(
    postgres_server: PostgresServer, postgres_dsn: str
) -> None:
    with PostgresStore(postgres_dsn, retry_timeout=1.5, connect_timeout=2) as store:
        asyncio.run(store.aappend_messages(KEY, user_messages(1)))
        postgres_server.stop()
        try:
            with pytest.raises(StoreConnectionError, match="retry_timeout") as err:
                asyncio.run(store.aappend_messages(KEY, user_messages(1, prefix="lost")))
            assert postgres_server.password not in str(err.value)
        finally:
            postgres_server.start()
    with PostgresStore(postgres_dsn) as check:
        assert message_ids(check.load_messages(KEY)) == ["m0"]
