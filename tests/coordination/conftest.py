"""A real MQTT broker for the coordination tests, started on a free loopback port.

mosquitto when it is installed (``apt-get install mosquitto``), else the pure-Python amqtt
broker (``pip install amqtt``); neither: the MQTT tests fail with that message (they never
skip). ``MARSYS_MQTT_BROKER=amqtt`` forces the fallback. The broker runs with persistence
in the test's temporary folder, so :meth:`Broker.restart` keeps QoS 1 sessions.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mosquitto() -> str | None:
    found = shutil.which("mosquitto")
    if found:
        return found
    for candidate in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _mosquitto_passwd() -> str | None:
    found = shutil.which("mosquitto_passwd")
    if found:
        return found
    candidate = "/usr/bin/mosquitto_passwd"
    return candidate if os.access(candidate, os.X_OK) else None


class Broker:
    """A broker process on ``127.0.0.1:port``: ``start()``, ``stop()``, ``restart()``,
    ``kill()`` (SIGKILL) and ``crash_restart()``."""

    def __init__(self, workdir: Path, *, users: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host = "127.0.0.1"
        self.port = free_port()
        self.users = users
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "broker.log"
        forced = os.environ.get("MARSYS_MQTT_BROKER", "")
        exe = None if forced == "amqtt" else _mosquitto()
        if exe is not None:
            self.kind = "mosquitto"
            self.command = [exe, "-c", str(self._mosquitto_config())]
        else:
            self.kind = "amqtt"
            self.command = self._amqtt_command()

    # ------------------------------------------------------------------ configs
    def _mosquitto_config(self) -> Path:
        lines = [
            f"listener {self.port} 127.0.0.1",
            "persistence true",
            f"persistence_location {self.workdir}/",
            "persistence_file mosquitto.db",
            "autosave_interval 1",
            "max_queued_messages 100000",
            "log_type error",
            "log_type warning",
        ]
        if os.geteuid() == 0:
            lines.append("user root")  # else mosquitto drops to 'mosquitto': tmp not writable
        if self.users:
            passwd = _mosquitto_passwd()
            if passwd is None:
                pytest.fail("mosquitto_passwd is missing (apt-get install mosquitto)")
            pwfile = self.workdir / "passwd"
            pwfile.touch(mode=0o600)
            for user, password in self.users.items():
                subprocess.run([passwd, "-b", str(pwfile), user, password], check=True)
            lines += ["allow_anonymous false", f"password_file {pwfile}"]
        else:
            lines.append("allow_anonymous true")
        conf = self.workdir / "mosquitto.conf"
        conf.write_text("\n".join(lines) + "\n")
        return conf

    def _amqtt_command(self) -> list[str]:
        try:
            import amqtt  # noqa: F401
        except ImportError:
            pytest.fail(
                "the MQTT tests need a broker: install mosquitto (apt-get install -y "
                "mosquitto) or the amqtt package (pip install amqtt)"
            )
        import yaml

        plugins: dict[str, object] = {}
        if self.users:
            from pwdlib.hashers.argon2 import Argon2Hasher  # comes with amqtt

            pwfile = self.workdir / "passwd"
            hasher = Argon2Hasher()
            pwfile.write_text("".join(f"{u}:{hasher.hash(p)}\n" for u, p in self.users.items()))
            plugins["amqtt.plugins.authentication.FileAuthPlugin"] = {
                "password_file": str(pwfile)
            }
        else:
            plugins["amqtt.plugins.authentication.AnonymousAuthPlugin"] = {
                "allow_anonymous": True
            }
        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{self.port}"}},
            "plugins": plugins,
        }
        conf = self.workdir / "amqtt.yaml"
        conf.write_text(yaml.safe_dump(config))
        return [sys.executable, "-m", "amqtt.scripts.broker_script", "-c", str(conf)]

    @property
    def protocol(self) -> str:
        """The MQTT version the clients should speak (amqtt: 3.1.1 only)."""
        return "5" if self.kind == "mosquitto" else "3.1.1"

    # ------------------------------------------------------------------ process
    def start(self, timeout: float = 10.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=self.workdir)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.kind} exited with {self.proc.returncode}:\n"
                            f"{self.log_path.read_text(errors='replace')}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        self.stop()
        pytest.fail(f"{self.kind} did not listen on {self.host}:{self.port} in {timeout}s")

    def stop(self) -> None:
        """Stop gracefully (SIGTERM: mosquitto writes its sessions to disk first)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def restart(self, down_for: float = 0.3) -> None:
        """Stop, stay down ``down_for`` seconds, start again on the same port."""
        self.stop()
        time.sleep(down_for)
        self.start()

    def kill(self) -> None:
        """Crash: SIGKILL, so nothing is written to disk first (what was not yet saved
        by ``autosave_interval`` is lost, as after a power cut)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def crash_restart(self, down_for: float = 0.3) -> None:
        """``kill()``, stay down ``down_for`` seconds, start again on the same port."""
        self.kill()
        time.sleep(down_for)
        self.start()

    def __repr__(self) -> str:
        return f"Broker({self.kind}, {self.host}:{self.port})"


@pytest.fixture(scope="session")
def mqtt_broker(tmp_path_factory: pytest.TempPathFactory):
    """A broker for the whole session (anonymous clients allowed)."""
    broker = Broker(tmp_path_factory.mktemp("mqtt"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def secure_broker(tmp_path_factory: pytest.TempPathFactory):
    """A broker that requires username ``agent`` / password ``s3cret``."""
    broker = Broker(tmp_path_factory.mktemp("mqtt-auth"), users={"agent": "s3cret"})
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def crash_broker(tmp_path_factory: pytest.TempPathFactory):
    """A mosquitto of the test module's own, with persistence, for tests that kill it."""
    broker = Broker(tmp_path_factory.mktemp("mqtt-crash"))
    if broker.kind != "mosquitto":
        pytest.fail("the broker fault tests need mosquitto (apt-get install -y mosquitto): "
                    "the amqtt fallback has no persistence to crash")
    broker.start()
    yield broker
    broker.stop()
