"""Fixtures of the store tests: a fresh schema per test on the session's PostgreSQL.

The server is ``postgres_server`` (tests/conftest.py; no pgvector: the fallback path), or
``pgvector_server`` for ``pgvector_dsn`` (the ``vector`` extension installed: search inside
the database). Without the binaries the tests that use them skip, and fail in CI.
"""

import itertools
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from marsys_mem import Message
from marsys_mem.store.sqlite import MIGRATIONS
from marsys_mem.testing.postgres import PostgresServer

_names = itertools.count()


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """A DSN whose search_path is a new, empty schema (one per test)."""
    return postgres_server.create_schema(f"t{next(_names)}")


@pytest.fixture
def pgvector_dsn(pgvector_server: PostgresServer) -> str:
    """A DSN whose search_path is a new, empty schema on the pgvector server (one per test)."""
    return pgvector_server.create_schema(f"v{next(_names)}")


@pytest.fixture
def new_pgvector_dsn(pgvector_server: PostgresServer) -> Callable[[], str]:
    """Make as many fresh schemas on the pgvector server as a test needs."""
    return lambda: pgvector_server.create_schema(f"v{next(_names)}")


@pytest.fixture
def new_postgres_dsn(postgres_server: PostgresServer) -> Callable[[], str]:
    """Make as many fresh schemas as a test needs."""
    return lambda: postgres_server.create_schema(f"t{next(_names)}")


_KEY = ("default", "a", "main")


def _older_store(
    path: Path, version: int, messages: list[Message], *, wal: bool = False
) -> None:
    """A store file as version ``version`` of marsys-mem left it, holding ``messages``."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for target in range(1, version + 1):
        MIGRATIONS[target - 1](conn)
        conn.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?, 'then')", (target,)
        )
    columns = "namespace, agent, branch, message_id, ts, data"
    for i, m in enumerate(messages):
        conn.execute(
            f"INSERT INTO messages ({columns}) VALUES (?, ?, ?, ?, ?, ?)",
            (*_KEY, m.message_id, 1_000_000 * (i + 1), m.model_dump_json()),
        )
        if version >= 2:  # version 2 on set protected as it wrote
            conn.execute(
                "UPDATE messages SET protected = ? WHERE message_id = ?",
                (int(m.is_protected), m.message_id),
            )
    if version >= 3:
        conn.execute("INSERT INTO key_counts VALUES (?, ?, ?, ?)", (*_KEY, len(messages)))
        conn.execute("PRAGMA application_id = 1296909645")
    conn.execute("COMMIT")
    if wal:  # versions 3 and 4 kept their files in WAL mode
        conn.execute("PRAGMA journal_mode = WAL")
    conn.close()


@pytest.fixture
def older_store() -> Callable[..., None]:
    """``older_store(path, version, messages, wal=False)``: a file as an older version left it.

    The messages go under ``("default", "a", "main")``; versions 3 and 4 kept WAL mode.
    """
    return _older_store
