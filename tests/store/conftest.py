"""Fixtures of the store tests: one PostgreSQL server for the session (started here).

The server is :class:`marsys_mem.testing.postgres.PostgresServer` (initdb + pg_ctl on a
free loopback port, in a temporary folder; never the machine's own PostgreSQL). Without
the binaries the tests that use it skip, and fail in CI.
"""

import itertools
from collections.abc import Callable, Iterator

import pytest

from marsys_mem.testing.postgres import PostgresServer, require_postgres

_names = itertools.count()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = require_postgres()
    with PostgresServer(bin_dir=bin_dir, settings={"fsync": "off"}) as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """A DSN whose search_path is a new, empty schema (one per test)."""
    return postgres_server.create_schema(f"t{next(_names)}")


@pytest.fixture
def new_postgres_dsn(postgres_server: PostgresServer) -> Callable[[], str]:
    """Make as many fresh schemas as a test needs."""
    return lambda: postgres_server.create_schema(f"t{next(_names)}")
