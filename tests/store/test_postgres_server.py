"""marsys_mem.testing.postgres: the throwaway server the PostgreSQL tests (and others) use."""

import gc
import os
import shutil
import tempfile

import psycopg
import pytest

from marsys_mem.testing import postgres as pg_testing
from marsys_mem.testing.postgres import PostgresServer, require_postgres


def test_server_runs_unprivileged_restarts_on_its_port_and_cleans_up() -> None:
    bin_dir = require_postgres()
    server = PostgresServer(bin_dir=bin_dir, settings={"fsync": "off"})
    with server:
        assert server.port not in (0, 5432)
        if os.geteuid() == 0:  # PostgreSQL refuses root: the data belongs to another account
            assert server.data_dir.stat().st_uid != 0
        dsn = server.create_database("kept")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (x int)")
            conn.execute("INSERT INTO t VALUES (1), (2)")
        port = server.port
        server.stop(mode="immediate")  # a crash: recovery on the next start
        server.start()
        server.kill()  # SIGKILL of the postmaster
        server.start()
        assert server.port == port
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (2,)
        with pytest.raises(ValueError, match="identifier"):
            server.create_schema("Bad Name")
    assert not server.root.exists()
    server.close()  # idempotent


def test_missing_binaries_skip_locally_and_fail_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_testing, "find_postgres_bin", lambda: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="initdb/pg_ctl not found"):
        require_postgres()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        require_postgres()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="setting name"):
        PostgresServer(bin_dir=require_postgres(), settings={"fsync = off; x": "1"})


def test_a_kept_cluster_outlives_its_server_object() -> None:
    bin_dir = require_postgres()
    parent = tempfile.mkdtemp(prefix="marsys-kept-")  # the system's temp: the account reaches it
    os.chmod(parent, 0o711)
    folder = os.path.join(parent, "cluster")
    with PostgresServer(bin_dir=bin_dir, settings={"fsync": "off"}, keep=folder) as server:
        assert not server.has_database("kept")
        dsn = server.create_database("kept")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (x int)")
            conn.execute("INSERT INTO t VALUES (1)")
        password = server.password
    assert os.path.isdir(os.path.join(folder, "data"))  # stopped, kept
    assert oct(os.stat(os.path.join(folder, "password")).st_mode & 0o777) == "0o600"
    again = PostgresServer(bin_dir=bin_dir, keep=folder)
    with again:
        assert again.password == password
        assert again.has_database("kept")
        with psycopg.connect(again.dsn("kept"), autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)
    assert os.path.isdir(os.path.join(folder, "data"))
    shutil.rmtree(parent)


def test_a_second_server_object_on_a_running_kept_cluster_leaves_it_running() -> None:
    bin_dir = require_postgres()
    parent = tempfile.mkdtemp(prefix="marsys-kept-")
    os.chmod(parent, 0o711)
    folder = os.path.join(parent, "cluster")
    try:
        with PostgresServer(bin_dir=bin_dir, settings={"fsync": "off"}, keep=folder) as server:
            other = PostgresServer(bin_dir=bin_dir, keep=folder)
            with pytest.raises(pg_testing.PostgresServerError, match="already runs"):
                other.start()
            assert other.port == 0  # nothing of the running cluster's settings rewritten
            del other
            gc.collect()  # the refused object stops nothing when it goes
            with psycopg.connect(server.dsn(), autocommit=True, connect_timeout=5) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        shutil.rmtree(parent)
