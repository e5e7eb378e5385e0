"""PostgresStore's vector cursor is in commit order across connections (hosts)."""

import threading

import numpy as np
import psycopg

from marsys_mem.model.messages import Message
from marsys_mem.store.base import PutVectors
from marsys_mem.store.postgres import PostgresStore
from marsys_mem.store.postgres_vectors import put_vectors

KEY = ("default", "rag", "main")
MODEL = "toy-3d"


def _vec(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((1, 3), dtype=np.float32)


def test_a_reader_never_misses_a_vector_committed_late(postgres_dsn: str) -> None:
    """A vector write that started first but commits last is still after a reader's cursor.

    With a plain sequence, the write holding the lower number could commit after a reader
    already read past the higher one, and that reader would never see it. Here the second
    writer waits for the first one's commit before it numbers its vectors.
    """
    with PostgresStore(postgres_dsn, max_size=2) as store:
        store.append_messages(KEY, [Message.user(f"m{i}", message_id=f"m{i}") for i in range(2)])
        other = ("default", "other", "main")
        store.append_messages(other, [Message.user("o", message_id="o0")])
        with psycopg.connect(postgres_dsn, autocommit=True) as slow:
            slow.execute("BEGIN")
            vec = _vec(0)
            vec.flags.writeable = False
            put_vectors(slow, PutVectors(KEY, MODEL, ("m0",), vec))
            done = threading.Event()

            def later() -> None:
                store.put_vectors(other, MODEL, ["o0"], _vec(1))
                done.set()

            writer = threading.Thread(target=later)
            writer.start()
            try:
                assert not done.wait(0.5), "the later vector write did not wait its turn"
                first = store.load_vectors(None, MODEL)
                assert first.message_ids == ()  # nothing committed yet
            finally:
                slow.execute("COMMIT")
                writer.join(30)
            assert done.is_set()
        caught = store.load_vectors(None, MODEL, after=first.cursor)
        assert caught.message_ids == ("m0", "o0")
        again = store.load_vectors(None, MODEL, after=caught.cursor)
        assert again.message_ids == ()
