"""The writer a child process runs for the durability and multi-process tests.

A child opens the store with the backend's factory, prints ``ready``, waits for ``go`` on
stdin, then writes ``rounds`` batches of two messages: each batch appends them to its own
key and, in one transaction, to a shared key. After each batch it prints the ids it
wrote (an acknowledgement: the batch returned). With ``exit`` as its last step it leaves
with :func:`os._exit`, never closing the store, so only what the backend made durable
before returning is there afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Literal

from marsys_mem.store.base import Append, Key
from marsys_mem.testing.conformance.data import user_messages
from marsys_mem.testing.conformance.harness import load_factory

__all__ = [
    "PER_BATCH",
    "SHARED_KEY",
    "WriterProcess",
    "main",
    "own_key",
]

PER_BATCH = 2
"""Messages per batch a writer appends (to its own key and to :data:`SHARED_KEY`)."""

_CHILD_CODE = "from marsys_mem.testing.conformance.writer import main; main()"

SHARED_KEY: Key = ("conformance", "shared", "main")
"""The key every writer appends to."""


def own_key(writer: str) -> Key:
    """The key only ``writer`` appends to.

    Args:
        writer: the writer's name.

    Returns:
        ``("conformance", writer, "main")``.

    Example:
        >>> own_key("w0")
        ('conformance', 'w0', 'main')
    """
    return ("conformance", writer, "main")


def main(argv: Sequence[str] | None = None) -> None:
    """Run one writer: ``FACTORY LOCATION WRITER ROUNDS close|exit`` (see the module).

    Args:
        argv: the arguments; ``sys.argv[1:]`` when None.
    """
    factory_ref, location, writer, rounds, ending = list(sys.argv[1:] if argv is None else argv)
    store = load_factory(factory_ref)(location)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("writer: expected 'go' on stdin")
    for i in range(int(rounds)):
        msgs = tuple(user_messages(PER_BATCH, prefix=f"{writer}-{i}-"))
        store.batch([Append(own_key(writer), msgs), Append(SHARED_KEY, msgs)])
        print(" ".join(m.message_id for m in msgs), flush=True)
    if ending == "exit":
        os._exit(0)  # no close, no flush: what returned must already be durable
    store.close()


class WriterProcess:
    """A child process running :func:`main`; start it, let it go, collect what it acked.

    Example:
        >>> WriterProcess.command()[1:3]
        ['-c', 'from marsys_mem.testing.conformance.writer import main; main()']
    """

    def __init__(
        self,
        factory_ref: str,
        location: str,
        writer: str,
        rounds: int,
        ending: Literal["close", "exit"] = "close",
    ) -> None:
        self.writer = writer
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [p for p in sys.path if p] + [env.get("PYTHONPATH", "")]
        )
        self.process = subprocess.Popen(  # noqa: S603 (this interpreter, an argv list, no shell)
            [*self.command(), factory_ref, location, writer, str(rounds), ending],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    @staticmethod
    def command() -> list[str]:
        """The interpreter and arguments that run :func:`main` in a child process."""
        return [sys.executable, "-c", _CHILD_CODE]

    def wait_ready(self) -> None:
        """Block until the child has opened the store.

        Raises:
            AssertionError: the child ended first (its stderr is in the message).
        """
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            self.process.kill()
            _, err = self.process.communicate(timeout=30)
            raise AssertionError(f"writer {self.writer} did not start: {line!r}\n{err}")

    def go(self) -> None:
        """Let the child write."""
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def acknowledged(self, timeout: float = 120) -> list[str]:
        """Wait for the child to end; the ids it acknowledged, in order.

        Args:
            timeout: seconds to wait.

        Returns:
            The ids, in the order written.

        Raises:
            AssertionError: the child failed (its stderr is in the message).
        """
        try:
            out, err = self.process.communicate(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        if self.process.returncode != 0:
            raise AssertionError(
                f"writer {self.writer} exited with {self.process.returncode}:\n{err}"
            )
        return out.split()

    def kill(self) -> None:
        """Kill the child if it still runs, and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()
