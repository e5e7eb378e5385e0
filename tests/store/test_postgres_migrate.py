"""``marsys-mem migrate --postgres``: an older PostgreSQL schema upgraded in one transaction."""

from __future__ import annotations

import psycopg
import pytest

from marsys_mem.cli.main import main as cli
from marsys_mem.store.postgres import MIGRATIONS, PostgresStore

pytestmark = pytest.mark.slow


def _versions(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [int(r[0]) for r in conn.execute("SELECT version FROM marsys_schema_version")]


def test_migrate_postgres_upgrades_an_older_schema(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(postgres_dsn) as conn, conn.transaction():  # as version 1 left it
        MIGRATIONS[0](conn)
        conn.execute("INSERT INTO marsys_schema_version (version) VALUES (1)")
    monkeypatch.setenv("TEAM_PG_DSN", postgres_dsn)
    assert cli(["migrate", "--postgres", "--dsn-env", "TEAM_PG_DSN"]) == 0
    out = capsys.readouterr().out
    assert f"migrated from schema version 1 to {len(MIGRATIONS)}" in out
    assert postgres_dsn not in out  # the DSN (and its password) is not printed
    assert _versions(postgres_dsn) == list(range(1, len(MIGRATIONS) + 1))
    assert cli(["migrate", "--postgres", "--dsn-env", "TEAM_PG_DSN"]) == 0
    assert f"schema version {len(MIGRATIONS)}, up to date (unchanged)" in capsys.readouterr().out
    with PostgresStore(postgres_dsn) as store:
        assert store.found_schema_version == len(MIGRATIONS)


def test_migrate_postgres_needs_its_dsn(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MARSYS_MEM_PG_DSN", raising=False)
    assert cli(["migrate", "--postgres"]) == 2
    assert "error: --postgres: $MARSYS_MEM_PG_DSN is not set" in capsys.readouterr().err
    assert cli(["migrate", "x.db", "--postgres"]) == 2
    assert "give a STORE file or --postgres, not both" in capsys.readouterr().err
