"""WorkAhead: a job runs once, on the helper thread or on the caller's, whichever is first."""

import threading

import pytest

from marsys_mem.retrieval.ahead import WorkAhead


def test_a_started_job_runs_once_on_the_helper_and_gives_its_value():
    ran: list[str] = []
    ready = threading.Event()

    def job() -> int:
        ran.append(threading.current_thread().name)
        ready.set()
        return 42

    ahead = WorkAhead.start(job)
    assert ready.wait(5)  # the helper ran it without anyone asking
    assert ahead.result() == 42
    assert ahead.result() == 42
    assert len(ran) == 1
    assert ran[0].startswith("marsys-mem-ahead")


def test_the_caller_runs_the_job_itself_when_the_helper_is_busy():
    release = threading.Event()
    blocker = WorkAhead.start(lambda: release.wait(10))  # holds the one helper thread
    ran: list[str] = []
    ahead = WorkAhead.start(lambda: ran.append(threading.current_thread().name) or "done")
    assert ahead.result() == "done"  # no waiting for the helper
    assert ran == [threading.current_thread().name]
    release.set()
    assert blocker.result() is True
    assert ran == [threading.current_thread().name]  # the helper skipped the taken job


def test_a_job_that_is_never_started_runs_in_the_caller():
    assert WorkAhead(lambda: "here").result() == "here"


def test_the_jobs_exception_reaches_the_caller():
    def fail() -> None:
        raise ValueError("bad query")

    with pytest.raises(ValueError, match="bad query"):
        WorkAhead.start(fail).result()


def test_concurrent_callers_each_get_their_own_value():
    out: dict[int, int] = {}

    def caller(i: int) -> None:
        for j in range(200):
            assert WorkAhead.start(lambda i=i, j=j: i * 1000 + j).result() == i * 1000 + j
        out[i] = i

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == {0: 0, 1: 1, 2: 2, 3: 3}
