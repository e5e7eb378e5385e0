"""Fixtures of the store tests: a fresh schema per test on the session's PostgreSQL.

The server is ``postgres_server`` (tests/conftest.py). Without the binaries the tests that
use it skip, and fail in CI.
"""

import itertools
from collections.abc import Callable

import pytest

from marsys_mem.testing.postgres import PostgresServer

_names = itertools.count()


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """A DSN whose search_path is a new, empty schema (one per test)."""
    return postgres_server.create_schema(f"t{next(_names)}")


@pytest.fixture
def new_postgres_dsn(postgres_server: PostgresServer) -> Callable[[], str]:
    """Make as many fresh schemas as a test needs."""
    return lambda: postgres_server.create_schema(f"t{next(_names)}")
