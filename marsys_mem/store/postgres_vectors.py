"""PostgresStore's vector operations: embeddings stored once, beside their messages.

The SQL behind ``PutVectors``, ``LoadVectors`` and ``LoadAfter`` for
:class:`~marsys_mem.store.postgres.PostgresStore` (see :mod:`marsys_mem.store.vectors` for
the contract), and the schema migration that adds their tables::

    marsys_vector_models(model PRIMARY KEY, dim)   -- a model's one dimension
    marsys_vector_clock(id = 1, last)              -- the last vector cursor handed out
    marsys_vectors(vseq UNIQUE,                    -- the vector cursor (write order)
                   key_id, message_id, model,      -- PRIMARY KEY; FOREIGN KEY (key_id,
                   data bytea)                     --   message_id) -> marsys_messages
                                                   --   ON DELETE CASCADE; float32 LE

Deleted with their messages: the foreign key cascades, so whatever deletes a message
(``delete_messages``, retention, a whole key) deletes its vectors in the same transaction.

Cursors across hosts: a reader that caught up to cursor ``c`` must never later miss a
vector numbered below ``c``. A plain sequence cannot promise that (numbers are handed out
when a transaction asks, not when it commits: a transaction holding 10 can commit after
another one holding 11 was read). So every ``PutVectors`` takes its numbers from the
one row of ``marsys_vector_clock`` (``UPDATE ... RETURNING``), which row-locks it until
the transaction ends: vector writes take turns on it, their numbers are in commit order,
and ``vseq > c`` misses nothing committed later. Only the vector writes serialise (each
holds the clock from its ``PutVectors`` to its commit, a few milliseconds); appends and
reads never touch it. Deadlock-free: a batch takes its keys' row locks before the clock
(``PutVectors`` locks its key first, as every write does; batches of several keys lock them
all up front, in order). The message cursor (``LoadAfter``) is the key's ``seq``, already
handed out under the key's row lock, so in commit order per key.

This layout keeps the vectors as exact ``float32`` bytes, portable across backends; with
pgvector, :mod:`marsys_mem.store.postgres_search` adds an indexed ``embedding`` column.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from marsys_mem.exceptions import MessageNotFoundError, StoreError
from marsys_mem.model.messages import MESSAGE_LIST_ADAPTER
from marsys_mem.store.base import Key, LoadAfter, LoadVectors, PutVectors
from marsys_mem.store.postgres_search import SearchSetup, literals, model_index
from marsys_mem.store.vectors import MessagePage, VectorPage, from_bytes, to_bytes

__all__ = ["load_after", "load_vectors", "migrate_vectors", "put_vectors"]

Connection = psycopg.Connection[tuple[Any, ...]]

_KEY_WHERE = "namespace = %s AND agent = %s AND branch = %s"


def migrate_vectors(conn: Connection) -> None:
    """Schema version 2: the vector tables (empty: nothing was embedded into a store before)."""
    conn.execute(
        "CREATE TABLE marsys_vector_models ("
        ' model text COLLATE "C" PRIMARY KEY,'
        " dim integer NOT NULL CHECK (dim > 0))"
    )
    conn.execute(
        "CREATE TABLE marsys_vector_clock ("
        " id integer PRIMARY KEY CHECK (id = 1),"
        " last bigint NOT NULL)"
    )
    conn.execute("INSERT INTO marsys_vector_clock (id, last) VALUES (1, 0)")
    conn.execute(
        "CREATE TABLE marsys_vectors ("
        " vseq bigint NOT NULL UNIQUE,"
        " key_id bigint NOT NULL,"
        ' message_id text COLLATE "C" NOT NULL,'
        ' model text COLLATE "C" NOT NULL,'
        " data bytea NOT NULL,"
        " PRIMARY KEY (key_id, message_id, model),"
        " FOREIGN KEY (key_id, message_id) REFERENCES marsys_messages (key_id, message_id)"
        " ON DELETE CASCADE)"
    )
    conn.execute("CREATE INDEX marsys_vectors_by_model ON marsys_vectors (model, vseq)")
    conn.execute("CREATE INDEX marsys_vectors_by_key ON marsys_vectors (key_id, model, vseq)")


def _key_id(conn: Connection, key: Key, *, lock: bool) -> int | None:
    sql = f"SELECT id FROM marsys_keys WHERE {_KEY_WHERE}" + (" FOR UPDATE" if lock else "")  # noqa: S608 (SQL from constants; values bound)
    row = conn.execute(sql, key).fetchone()
    return int(row[0]) if row else None


def _model_dim(conn: Connection, model: str) -> int | None:
    row = conn.execute("SELECT dim FROM marsys_vector_models WHERE model = %s", (model,)).fetchone()
    return int(row[0]) if row else None


def put_vectors(conn: Connection, op: PutVectors, search: SearchSetup | None = None) -> int:
    """Run ``op`` inside the batch's transaction; the number of vectors stored.

    ``search``: the store searches inside the database; the vectors also go to the
    indexed ``embedding`` column (:mod:`marsys_mem.store.postgres_search`), and a new
    model gets its index.

    Raises:
        MessageNotFoundError: a message id is not stored under the key.
        ValueError: the model's vectors are stored with another dimension.
    """
    dim = int(op.vectors.shape[1])
    key_id = _key_id(conn, op.key, lock=True)
    ids = list(op.message_ids)
    found: set[str] = set()
    if key_id is not None:
        found = {
            str(r[0])
            for r in conn.execute(
                "SELECT message_id FROM marsys_messages"
                " WHERE key_id = %s AND message_id = ANY(%s::text[])",
                (key_id, ids),
            )
        }
    missing = next((mid for mid in ids if mid not in found), None)
    if missing is not None:
        raise MessageNotFoundError(f"put_vectors: no message {missing!r} is stored under {op.key}")
    new = conn.execute(
        "INSERT INTO marsys_vector_models (model, dim) VALUES (%s, %s)"
        " ON CONFLICT (model) DO NOTHING RETURNING dim",
        (op.model, dim),
    ).fetchone()
    known = _model_dim(conn, op.model)
    if known != dim:
        raise ValueError(f"vectors of model {op.model!r} are {known}-D in this store, got {dim}-D")
    row = conn.execute(
        "UPDATE marsys_vector_clock SET last = last + %s WHERE id = 1 RETURNING last",
        (len(ids),),
    ).fetchone()
    if row is None:  # pragma: no cover - the migration inserts the row
        raise StoreError("marsys_vector_clock has no row: the schema is damaged")
    first = int(row[0]) - len(ids)
    if search is not None:
        conn.execute(
            sql.SQL(
                "INSERT INTO marsys_vectors (vseq, key_id, message_id, model, data, embedding)"
                " SELECT %s + u.ord, %s, u.mid, %s, u.data, u.emb::{}"
                " FROM unnest(%s::text[], %s::bytea[], %s::text[])"
                " WITH ORDINALITY AS u(mid, data, emb, ord)"
                " ON CONFLICT (key_id, message_id, model) DO UPDATE SET vseq = excluded.vseq,"
                " data = excluded.data, embedding = excluded.embedding"
            ).format(search.halfvec(dim)),
            (
                first,
                key_id,
                op.model,
                ids,
                [to_bytes(v) for v in op.vectors],
                literals(op.vectors),
            ),
        )
        # a new model: its HNSW index, built at once (IVFFlat lists are trained on the
        # vectors when the index is built: bulk_load or rebuild_vector_index)
        if new is not None and not search.deferred and search.index.kind == "hnsw":
            model_index(conn, search, op.model, dim)
        return len(ids)
    conn.execute(
        "INSERT INTO marsys_vectors (vseq, key_id, message_id, model, data)"
        " SELECT %s + u.ord, %s, u.mid, %s, u.data"
        " FROM unnest(%s::text[], %s::bytea[]) WITH ORDINALITY AS u(mid, data, ord)"
        " ON CONFLICT (key_id, message_id, model) DO UPDATE"
        " SET vseq = excluded.vseq, data = excluded.data",
        (first, key_id, op.model, ids, [to_bytes(v) for v in op.vectors]),
    )
    return len(ids)


def load_vectors(conn: Connection, op: LoadVectors) -> VectorPage:
    """Run ``op`` in one statement: the page's rows, each with the model's dimension.

    An empty page is one row, ``NULL`` but for the dimension (``NULL`` for an unknown
    model), so a catch-up that finds nothing new costs one round trip too.
    """
    page = (
        "SELECT vseq, key_id, message_id, data FROM marsys_vectors WHERE model = %s AND vseq > %s"
    )
    params: list[Any] = [op.model, op.after]
    if op.key is not None:
        page += f" AND key_id = (SELECT id FROM marsys_keys WHERE {_KEY_WHERE})"  # noqa: S608 (SQL from constants; values bound)
        params.extend(op.key)
    page += " ORDER BY vseq"
    if op.limit is not None:
        page += " LIMIT %s"
        params.append(op.limit)
    rows = conn.execute(
        "SELECT d.dim, p.vseq, k.namespace, k.agent, k.branch, p.message_id, p.data"  # noqa: S608 (SQL from constants; values bound)
        " FROM (SELECT (SELECT dim FROM marsys_vector_models WHERE model = %s) AS dim) AS d"
        f" LEFT JOIN (({page}) AS p JOIN marsys_keys AS k ON k.id = p.key_id) ON true"
        " ORDER BY p.vseq",
        [op.model, *params],
    ).fetchall()
    dim = int(rows[0][0]) if rows and rows[0][0] is not None else 0
    rows = [r for r in rows if r[1] is not None]
    try:
        vectors = from_bytes([bytes(r[6]) for r in rows], dim)
    except ValueError as exc:
        raise StoreError(f"stored vectors of model {op.model!r} are corrupt: {exc}") from exc
    return VectorPage(
        tuple((str(r[2]), str(r[3]), str(r[4])) for r in rows),
        tuple(str(r[5]) for r in rows),
        vectors,
        int(rows[-1][1]) if rows else op.after,
    )


def load_after(conn: Connection, op: LoadAfter) -> MessagePage:
    """Run ``op`` in one statement (messages and count from one snapshot)."""
    rows = conn.execute(
        "SELECT k.n, m.seq, m.data FROM marsys_keys AS k"  # noqa: S608 (SQL from constants; values bound)
        " LEFT JOIN marsys_messages AS m ON m.key_id = k.id AND m.seq > %s"
        f" WHERE {_KEY_WHERE} ORDER BY m.seq",
        (op.after, *op.key),
    ).fetchall()
    if not rows:
        return MessagePage([], op.after, 0)
    count = int(rows[0][0])
    found = [r for r in rows if r[1] is not None]
    if not found:
        return MessagePage([], op.after, count)
    messages = MESSAGE_LIST_ADAPTER.validate_json("[" + ",".join(r[2] for r in found) + "]")
    return MessagePage(messages, int(found[-1][1]), count)
