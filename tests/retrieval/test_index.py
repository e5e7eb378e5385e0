import json
import os
import threading

import faiss
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marsys_mem.exceptions import EmbeddingError, IndexCorruptError, StoreError
from marsys_mem.retrieval.codes import lists_for
from marsys_mem.retrieval.index import (
    COARSE_FROM,
    FORMAT_VERSION,
    FaissIndex,
    VectorIndex,
    single_thread,
)

DIM = 8


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def filled(kind: str = "flat", n: int = 50, seed: int = 0, **kwargs) -> tuple[FaissIndex, dict]:
    rng = np.random.default_rng(seed)
    vecs = unit(rng, n)
    ids = [f"id{i}" for i in range(n)]
    index = FaissIndex(DIM, kind, **kwargs)  # type: ignore[arg-type]
    index.add(ids, vecs)
    return index, dict(zip(ids, vecs, strict=True))


def brute_force(model: dict, query: np.ndarray, k: int) -> list[tuple[str, float]]:
    scored = [(id_, float(np.dot(v, query))) for id_, v in model.items()]
    scored.sort(key=lambda p: -p[1])
    return scored[:k]


def snapshot(index: FaissIndex) -> tuple:
    ids = index.ids()
    vecs = index.vectors(ids) if ids else np.zeros((0, index.dim), np.float32)
    return ids, vecs.copy(), index.kind, index.tombstones


# ----------------------------------------------------------------- basics


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_add_search_exact_neighbours(kind):
    index, model = filled(kind)
    assert len(index) == 50
    assert index.kind == kind
    assert isinstance(index, VectorIndex)
    queries = np.stack([model["id3"], model["id17"]])
    ids, scores = index.search(queries, k=5)
    assert [row[0] for row in ids] == ["id3", "id17"]
    assert scores.shape == (2, 5)
    assert scores.dtype == np.float32
    assert np.all(np.diff(scores, axis=1) <= 1e-6)  # best first
    for row, q in zip(ids, queries, strict=True):
        assert [p[0] for p in brute_force(model, q, 5)] == row


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_inner_products_follow_removals_replacements_and_reloads(kind, tmp_path):
    """The stored vectors are read in place, by row: rows move when the flat index closes
    the gaps of removed vectors, and HNSW keeps tombstones; every read is checked."""
    index, model = filled(kind, n=60)
    rng = np.random.default_rng(1)
    query = unit(rng, 1)[0]

    def check(ix: FaissIndex) -> None:
        asked = [*model, "nope", *list(model)[::3]]
        got = ix.inner_products(asked, query)
        want = [float(model[i] @ query) if i in model else np.nan for i in asked]
        np.testing.assert_allclose(got, want, atol=1e-6)
        assert got.dtype == np.float64

    check(index)
    gone = [f"id{i}" for i in range(0, 60, 4)]
    index.remove(gone)
    for mid in gone:
        del model[mid]
    check(index)
    fresh = unit(rng, 5)
    index.add(["id1", "id2", "new1", "new2", "new3"], fresh)  # replaced and new
    model.update(zip(["id1", "id2", "new1", "new2", "new3"], fresh, strict=True))
    check(index)
    index.save(tmp_path / "ix")
    check(FaissIndex.load(tmp_path / "ix"))
    assert np.isnan(index.inner_products(["nope"], query)).all()
    assert index.inner_products([], query).shape == (0,)
    with pytest.raises(EmbeddingError, match="dimension"):
        index.inner_products(["id3"], np.zeros(DIM + 1, dtype=np.float32))
    index.clear()
    assert np.isnan(index.inner_products(["id3"], query)).all()


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_query_scores_match_search_and_inner_products(kind):
    """One query's scores: the best labels as a search finds them (ties included: equal
    vectors come in faiss's order), and any label's score, NaN once it is gone."""
    index, _ = filled(kind, n=80)
    rng = np.random.default_rng(3)
    dup = unit(rng, 1)
    index.add([f"dup{i}" for i in range(6)], np.repeat(dup, 6, axis=0))  # equal scores
    index.remove([f"id{i}" for i in range(0, 80, 5)])
    index.add(["id1"], unit(rng, 1))  # replaced: a new label
    for query in (dup[0], unit(rng, 1)[0]):
        scores = index.query_scores(query[None, :])
        for k in (1, 5, 10, 200):
            ids, want = index.search(query[None, :], k)
            labels, got = scores.top(k)
            assert index.ids_of_labels(labels) == ids[0]
            np.testing.assert_allclose(got, want[0], atol=1e-6)
            # the same vectors in no particular order (ties crossing the cut: the heap's)
            assert sorted(scores.candidates(k).tolist()) == sorted(labels.tolist())
        asked = [*index.ids(), "id0", "nope"]  # id0 was removed
        labels = index.labels(asked)
        labels[-2] = 0  # id0's old label: not live
        got_ip = scores.label_scores(labels)
        np.testing.assert_allclose(got_ip, index.inner_products(asked, query), atol=1e-6)
        assert np.isnan(got_ip[-2:]).all()
    with pytest.raises(EmbeddingError, match="one query row"):
        index.query_scores(np.zeros((2, DIM), dtype=np.float32))


def full_scan_top(index: FaissIndex, query: np.ndarray, k: int, monkeypatch) -> tuple:
    """``query_scores().top(k)`` as a small index has it: every vector scored."""
    with monkeypatch.context() as m:
        m.setattr("marsys_mem.retrieval.index.COARSE_FROM", 10**9)
        return index.query_scores(query[None, :]).top(k)


def test_a_large_flat_index_finds_its_best_through_codes_that_follow_its_rows(
    tmp_path, monkeypatch
):
    """From COARSE_FROM vectors, query_scores().top() scans codes (made in the background;
    the queries before them score every vector), then scores the codes' best exactly.
    The codes stay row for row with the storage while vectors are appended, removed (rows
    close up), replaced, and after a save and load (codes made again): each stored vector
    finds itself first, with its exact score; small k agree with a full scan; the best
    100 mostly do (random 32-dimensional vectors are the codes' worst case: nothing in
    them is shared, unlike embeddings)."""
    dim, rng = 32, np.random.default_rng(11)
    index = FaissIndex(dim, "flat")
    n = COARSE_FROM + 300
    vecs = unit(rng, n, dim)
    vecs[7] = vecs[900] = vecs[3000] = vecs[4100]  # equal scores, across the storage
    index.add([f"id{i}" for i in range(n)], vecs)
    near = vecs[rng.integers(0, n, 20)] + 0.2 * unit(rng, 20, dim)
    queries = np.concatenate([vecs[[7, 11]], near / np.linalg.norm(near, axis=1)[:, None]])

    first = index.query_scores(queries[0][None, :]).top(100)  # starts making the codes
    assert index._codes.coded_rows == 0  # not waited for: this query scored every vector
    assert first[0].tolist() == full_scan_top(index, queries[0], 100, monkeypatch)[0].tolist()

    def check(index: FaissIndex, queries: np.ndarray) -> None:
        assert index.build_codes()
        assert index._codes.coded_rows == len(index)
        ids = index.ids()
        for i in range(0, len(ids), 97):  # each vector finds itself (ties: an equal one)
            vector = index.vectors([ids[i]])
            labels, got = index.query_scores(vector).top(1)
            assert got[0] == pytest.approx(float(vector[0] @ vector[0]), abs=1e-5)
            assert index.vectors(index.ids_of_labels(labels))[0] @ vector[0] > 0.9999
        overlap: list[int] = []
        approximate: list[int] = []
        for query in queries:
            scores = index.query_scores(query[None, :])
            for k in (1, 3, 10, 100):
                labels, got = scores.top(k)
                want_labels, want = full_scan_top(index, query, k, monkeypatch)
                if k <= 10:
                    assert labels.tolist() == want_labels.tolist()
                    np.testing.assert_allclose(got, want, atol=1e-6)
                else:
                    overlap.append(len(set(labels.tolist()) & set(want_labels.tolist())))
                exact = index.inner_products(index.ids_of_labels(labels), query)
                np.testing.assert_allclose(got, exact, atol=1e-5)  # scored exactly
            asked = index.labels(index.ids()[:50])
            want_ip = index.inner_products(index.ids()[:50], query)
            np.testing.assert_allclose(scores.label_scores(asked), want_ip, atol=1e-6)
            # candidates: the codes' best 100 by estimate, live and distinct, mostly the
            # exact best (an approximate search: about 2/3 of them on these random
            # vectors, 85% on MiniLM embeddings of chat messages)
            found = scores.candidates(100)
            assert len(set(found.tolist())) == 100
            assert not np.isnan(scores.label_scores(found)).any()
            exact = set(full_scan_top(index, query, 100, monkeypatch)[0].tolist())
            approximate.append(len(exact & set(found.tolist())))
        assert min(overlap) >= 90
        assert np.mean(overlap) >= 97
        assert np.mean(approximate) >= 60, approximate

    check(index, queries)
    index.add([f"late{i}" for i in range(40)], unit(rng, 40, dim))  # appended: coded later
    index.remove([f"id{i}" for i in range(0, 2000, 7)])  # rows close up in the codes too
    index.add(["id5", "id901"], unit(rng, 2, dim))  # replaced
    check(index, queries)
    index.save(tmp_path / "big.faiss")
    loaded = FaissIndex.load(tmp_path / "big.faiss")
    check(loaded, queries[:5])
    loaded.remove(loaded.ids()[: len(loaded) - COARSE_FROM + 1])  # below: the exact scan
    assert not loaded.build_codes()
    for query in queries[:5]:
        got = loaded.query_scores(query[None, :]).top(100)
        assert got[0].tolist() == full_scan_top(loaded, query, 100, monkeypatch)[0].tolist()


def clustered(rng: np.random.Generator, n: int, dim: int, centres: int = 60) -> np.ndarray:
    """Unit vectors around ``centres`` random directions, as embeddings of topics are."""
    middle = unit(rng, centres, dim)
    v = middle[rng.integers(0, centres, n)] + 0.35 * unit(rng, n, dim)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def test_an_ivf_index_splits_its_codes_into_lists_that_follow_its_rows(tmp_path, monkeypatch):
    """From lists_from vectors an "ivf" index's codes are split into lists under their row
    numbers: appends, removals (the later rows renumbered) and replacements keep every
    stored vector finding itself first with its exact score; a query scans a twelfth of
    the lists and still finds most of the exact best 10; a save and load keeps the kind
    and the threshold; below the threshold it is a flat index."""
    dim, rng = 32, np.random.default_rng(5)
    n = 2 * COARSE_FROM
    vecs = clustered(rng, n, dim)
    index = FaissIndex(dim, "ivf", lists_from=COARSE_FROM)
    assert (index.kind, index.requested_kind) == ("flat", "ivf")
    index.add([f"id{i}" for i in range(n)], vecs)
    near = vecs[rng.integers(0, n, 30)] + 0.2 * unit(rng, 30, dim)  # asked near stored ones
    queries = near / np.linalg.norm(near, axis=1)[:, None]

    def check(index: FaissIndex) -> None:
        assert index.build_codes()
        codes = index._codes._codes
        assert codes is not None
        assert codes.lists == lists_for(codes.trained_rows)
        assert codes.rows == len(index)
        ids = index.ids()
        for i in range(0, len(ids), 61):
            vector = index.vectors([ids[i]])
            labels, got = index.query_scores(vector).top(1)
            assert index.ids_of_labels(labels) == [ids[i]]
            assert got[0] == pytest.approx(float(vector[0] @ vector[0]), abs=1e-5)
        found = []
        for query in queries:
            labels, got = index.query_scores(query[None, :]).top(10)
            exact = index.inner_products(index.ids_of_labels(labels), query)
            np.testing.assert_allclose(got, exact, atol=1e-5)  # scored exactly
            want = full_scan_top(index, query, 10, monkeypatch)[0]
            found.append(len(set(labels.tolist()) & set(want.tolist())) / 10)
        assert np.mean(found) >= 0.85, found

    check(index)
    index.add([f"late{i}" for i in range(300)], clustered(rng, 300, dim))  # coded on search
    index.remove([f"id{i}" for i in range(0, 3000, 5)])  # later rows renumbered
    index.add(["id1", "id4001"], clustered(rng, 2, dim))  # replaced: removed and appended
    check(index)
    index.save(tmp_path / "ivf.faiss")
    loaded = FaissIndex.load(tmp_path / "ivf.faiss")
    assert loaded.requested_kind == "ivf"
    assert FaissIndex.read_header(tmp_path / "ivf.faiss")["lists_from"] == COARSE_FROM
    check(loaded)
    small = FaissIndex(dim, "ivf")  # below LISTS_FROM: one plain scan of every code
    small.add([f"s{i}" for i in range(COARSE_FROM)], vecs[:COARSE_FROM])
    assert small.build_codes()
    assert small._codes._codes is not None
    assert small._codes._codes.lists == 0


def test_codes_made_while_rows_moved_are_made_again_and_failures_leave_the_full_scan(
    monkeypatch, caplog
):
    """Codes made from rows that have since moved are dropped and made again; codes
    that cannot be made are logged once, and every query scores every vector."""
    dim, rng = 16, np.random.default_rng(3)
    index = FaissIndex(dim, "flat")
    vecs = unit(rng, COARSE_FROM + 100, dim)
    index.add([f"v{i}" for i in range(len(vecs))], vecs)
    index.query_scores(vecs[:1]).top(5)  # codes start from these rows
    index.remove([f"v{i}" for i in range(10)])  # rows move before they come
    assert index.build_codes()
    assert index._codes.coded_rows == len(index)
    query = vecs[50]
    assert index.query_scores(query[None, :]).top(1)[0].tolist() == index.labels(["v50"]).tolist()

    from marsys_mem.retrieval import codes as codes_module

    def broken(read: object, n: int, layout: int, lists_from: int | None = None) -> None:
        raise MemoryError("no room for codes")

    monkeypatch.setattr(codes_module.Codes, "make", staticmethod(broken))
    other = FaissIndex(dim, "flat")
    other.add([f"v{i}" for i in range(len(vecs))], vecs)
    with caplog.at_level("WARNING", logger="marsys_mem.retrieval.codes"):
        assert not other.build_codes()
        for query in vecs[:3]:
            got = other.query_scores(query[None, :]).top(10)
            assert got[0].tolist() == full_scan_top(other, query, 10, monkeypatch)[0].tolist()
    assert [r.getMessage() for r in caplog.records] == [
        "making codes for the vector index failed: no room for codes"
    ]
    assert not other._codes.making  # not tried again on every query


def test_codes_cut_through_ties_of_equal_vectors_and_the_full_scan_takes_over(monkeypatch):
    """A chat repeats lines: with every vector one of 40 lines, ties of ~110 equal vectors
    cross both the k-th place and the codes' cut, and the heap would keep other members of
    a tie than a full scan does; a candidate at the cut scoring the k-th score makes the
    index score every vector, so top() still equals the full scan's."""
    dim, rng = 32, np.random.default_rng(0)
    lines = unit(rng, 40, dim)
    n = COARSE_FROM + 300
    index = FaissIndex(dim, "flat")
    index.add([f"m{i}" for i in range(n)], lines[rng.integers(0, 40, n)])
    assert index.build_codes()
    near = lines[:40] + 0.3 * unit(rng, 40, dim)
    for query in near / np.linalg.norm(near, axis=1)[:, None]:
        for k in (10, 100):
            got = index.query_scores(query[None, :]).top(k)
            with monkeypatch.context() as m:
                m.setattr("marsys_mem.retrieval.index.COARSE_FROM", 10**9)
                want = index.query_scores(query[None, :]).top(k)
            assert got[0].tolist() == want[0].tolist()


def test_query_scores_see_the_vectors_of_their_time():
    """A flat index's scores are taken when asked; later removals do not move them."""
    index, model = filled("flat", n=30)
    query = unit(np.random.default_rng(4), 1)[0]
    scores = index.query_scores(query[None, :])
    labels = index.labels(["id5", "id20"])
    index.remove(["id0", "id1"])  # rows move
    index.add(["late"], unit(np.random.default_rng(5), 1))
    np.testing.assert_allclose(
        scores.label_scores(labels), [model["id5"] @ query, model["id20"] @ query], atol=1e-6
    )
    assert np.isnan(scores.label_scores(index.labels(["late"]))).all()
    assert FaissIndex(DIM, "flat").query_scores(query[None, :]).top(3)[0].size == 0


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_remove_and_replace(kind):
    index, model = filled(kind, n=20)
    assert index.remove(["id0", "id1", "nope", "id0"]) == 2
    assert "id0" not in index
    assert "id2" in index
    assert len(index) == 18
    ids, _ = index.search(np.stack([model["id0"]]), k=20)
    assert "id0" not in ids[0]
    assert "id1" not in ids[0]
    assert len(ids[0]) == 18
    # replace id5 with the vector of id9: searching id9's vector now ties both
    index.add(["id5"], model["id9"][None, :])
    assert len(index) == 18
    np.testing.assert_array_equal(index.vectors(["id5"])[0], model["id9"])
    ids, scores = index.search(model["id9"][None, :], k=2)
    assert set(ids[0]) == {"id5", "id9"}
    assert scores[0] == pytest.approx([1.0, 1.0], abs=1e-5)
    assert index.ids()[3] == "id5"  # keeps its place
    if kind == "hnsw":
        assert index.tombstones == 3


def test_search_fewer_than_k_and_empty_index():
    index = FaissIndex(DIM)
    ids, scores = index.search(np.ones((2, DIM), np.float32), k=3)
    assert ids == [[], []]
    assert scores.shape == (2, 0)
    index.add(["a", "b"], unit(np.random.default_rng(1), 2))
    ids, scores = index.search(np.ones((1, DIM), np.float32), k=10)
    assert sorted(ids[0]) == ["a", "b"]
    assert scores.shape == (1, 2)
    ids, scores = index.search(np.zeros((0, DIM), np.float32), k=3)
    assert ids == []
    assert scores.shape == (0, 2)
    index.add([], np.zeros((0, DIM)))
    assert len(index) == 2


def test_numpy_integer_k_and_ids_order():
    index, _ = filled(n=5)
    ids, _ = index.search(np.ones((1, DIM), np.float32), k=np.int64(2))
    assert len(ids[0]) == 2
    assert index.ids() == [f"id{i}" for i in range(5)]
    index.remove(iter(["id1"]))  # any iterable
    assert index.ids() == ["id0", "id2", "id3", "id4"]


def test_vectors_unknown_id():
    index, _ = filled(n=3)
    with pytest.raises(KeyError, match="'zz'"):
        index.vectors(["id0", "zz"])


def test_clear():
    index, _ = filled("auto", n=30, hnsw_threshold=10)
    assert index.kind == "hnsw"
    index.clear()
    assert len(index) == 0
    assert index.kind == "flat"
    index.add(["x"], np.ones((1, DIM)))
    assert index.search(np.ones((1, DIM)), k=1)[0] == [["x"]]


# ------------------------------------------------------------- auto / HNSW


def test_auto_switches_to_hnsw_past_threshold_and_stays():
    rng = np.random.default_rng(2)
    index = FaissIndex(DIM, "auto", hnsw_threshold=20)
    index.add([f"a{i}" for i in range(20)], unit(rng, 20))
    assert index.kind == "flat"
    assert index.requested_kind == "auto"
    index.add(["a20"], unit(rng, 1))
    assert index.kind == "hnsw"
    assert len(index) == 21
    v = index.vectors(["a7"])
    assert index.search(v, k=1)[0] == [["a7"]]
    index.remove([f"a{i}" for i in range(15)])
    assert index.kind == "hnsw"  # no flip-flopping back
    assert len(index) == 6
    assert index.tombstones == 0  # rebuilt: 15 of 21 were dead


def test_hnsw_tombstones_never_returned_and_rebuild():
    rng = np.random.default_rng(3)
    vecs = unit(rng, 100)
    index = FaissIndex(DIM, "hnsw")
    index.add([f"h{i}" for i in range(100)], vecs)
    gone = [f"h{i}" for i in range(0, 100, 10)]
    index.remove(gone)
    assert index.tombstones == 10
    ids, scores = index.search(vecs, k=100)
    for row, row_scores in zip(ids, scores, strict=True):
        assert not set(row) & set(gone)
        assert len(row) == len(set(row))
        assert np.all(np.isfinite(row_scores[: len(row)]))
    # the query equal to a removed vector finds something else
    assert ids[0][0] != "h0"
    assert ids[1][0] == "h1"
    index.remove([f"h{i}" for i in range(1, 20, 2)])  # 20 dead of 100: not yet over 20%
    assert index.tombstones == 20
    index.remove(["h3"])  # already gone: nothing changes
    assert index.tombstones == 20
    index.remove(["h2"])
    assert index.tombstones == 0
    assert len(index) == 79
    ids, _ = index.search(vecs, k=100)
    assert all(len(row) == 79 for row in ids)


def test_hnsw_replacements_are_tombstoned():
    rng = np.random.default_rng(4)
    index = FaissIndex(DIM, "hnsw")
    names = ["a", "b", "c", "d", "e", "f", "g", "h"]
    index.add(names, unit(rng, 8))
    new = unit(rng, 1)
    index.add(["a"], new)
    assert index.tombstones == 1
    ids, scores = index.search(new, k=8)
    assert ids[0][0] == "a"
    assert scores[0, 0] == pytest.approx(1.0, abs=1e-5)
    assert sorted(ids[0]) == names
    index.add(["b", "c"], unit(rng, 2))  # 3 dead of 11: rebuilt
    assert index.tombstones == 0
    assert sorted(index.search(new, k=8)[0][0]) == names


# ---------------------------------------------------------- validation


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
@pytest.mark.parametrize(
    ("ids", "vectors", "match"),
    [
        (["x"], np.full((1, DIM), np.nan), "NaN"),
        (["x"], np.full((1, DIM), np.inf), "NaN or infinity"),
        (["x"], np.ones((1, DIM + 1)), f"dimension {DIM + 1}, expected {DIM}"),
        (["x"], np.ones(DIM), "2-D"),
        (["x", "y"], np.ones((1, DIM)), "got 2 ids for 1 vectors"),
        (["x", "x"], np.ones((2, DIM)), "1 repeated ids.*'x'"),
        (["x", ""], np.ones((2, DIM)), r"ids\[1\] must be a non-empty str"),
        (["x", 3], np.ones((2, DIM)), r"ids\[1\]"),
        ("xy", np.ones((2, DIM)), "not one string"),
    ],
)
def test_bad_add_raises_and_changes_nothing(kind, ids, vectors, match):
    index, _ = filled(kind, n=10)
    before = snapshot(index)
    with pytest.raises(EmbeddingError, match=match):
        index.add(ids, vectors)
    after = snapshot(index)
    assert before[0] == after[0]
    np.testing.assert_array_equal(before[1], after[1])
    assert before[2:] == after[2:]


@pytest.mark.parametrize(
    ("queries", "k", "match"),
    [
        (np.ones((1, DIM)), 0, "k must be a positive int, got 0"),
        (np.ones((1, DIM)), -3, "got -3"),
        (np.ones((1, DIM)), True, "got True"),
        (np.ones((1, DIM)), 2.0, "got 2.0"),
        (np.ones((1, DIM - 1)), 1, f"dimension {DIM - 1}, expected {DIM}"),
        (np.full((1, DIM), np.nan), 1, "NaN"),
        (np.ones(DIM), 1, "2-D"),
    ],
)
def test_bad_search_raises(queries, k, match):
    index, _ = filled(n=5)
    with pytest.raises(EmbeddingError, match=match):
        index.search(queries, k)
    assert len(index) == 5


def test_bad_remove_raises_and_changes_nothing():
    index, _ = filled(n=5)
    with pytest.raises(EmbeddingError, match="not one string"):
        index.remove("id1")
    with pytest.raises(EmbeddingError, match=r"ids\[1\]"):
        index.remove(["id1", None])  # type: ignore[list-item]
    assert len(index) == 5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dim": 0},
        {"dim": 4, "kind": "lsh"},
        {"dim": 4, "hnsw_m": 1},
        {"dim": 4, "ef_search": 0},
        {"dim": 4, "lists_from": 100},
    ],
)
def test_bad_settings(kwargs):
    with pytest.raises(ValueError):  # noqa: PT011
        FaissIndex(**kwargs)


# ------------------------------------------------------------- files


@pytest.mark.parametrize("kind", ["flat", "hnsw", "auto"])
def test_save_load_round_trip(tmp_path, kind):
    index, model = filled(kind, n=40, hnsw_threshold=30, ef_search=32)
    index.remove(["id1", "id2", "id3"])
    index.add(["id4"], -model["id4"][None, :])
    path = tmp_path / "sub" / "index.mvi"
    index.save(path, meta={"embedder": "hashing-v1", "n": 1})
    assert FaissIndex.read_meta(path) == {"embedder": "hashing-v1", "n": 1}
    header = FaissIndex.read_header(path)
    assert header["version"] == FORMAT_VERSION
    assert header["count"] == 37
    assert header["dim"] == DIM
    assert header["kind"] == index.kind
    loaded = FaissIndex.load(path, expected_dim=DIM, expected_meta={"embedder": "hashing-v1"})
    assert loaded.ids() == index.ids()
    assert loaded.kind == index.kind
    assert loaded.requested_kind == kind
    assert loaded.tombstones == index.tombstones
    np.testing.assert_array_equal(loaded.vectors(loaded.ids()), index.vectors(index.ids()))
    queries = np.stack(list(model.values()))
    a_ids, a_scores = index.search(queries, k=7)
    b_ids, b_scores = loaded.search(queries, k=7)
    assert a_ids == b_ids
    np.testing.assert_array_equal(a_scores, b_scores)
    # labels keep counting after a load: new ids do not collide with old ones
    loaded.add(["new"], model["id0"][None, :])
    assert set(loaded.search(model["id0"][None, :], k=2)[0][0]) == {"id0", "new"}
    assert len(loaded) == 38
    assert [p.name for p in path.parent.iterdir()] == ["index.mvi"]  # no temp files left


def test_save_empty_and_load(tmp_path):
    path = tmp_path / "empty.mvi"
    FaissIndex(4).save(path)
    loaded = FaissIndex.load(path)
    assert len(loaded) == 0
    assert loaded.dim == 4
    assert FaissIndex.read_meta(path) == {}


def test_save_replaces_atomically_and_bad_meta_keeps_old_file(tmp_path):
    path = tmp_path / "i.mvi"
    index, _ = filled(n=5)
    index.save(path, meta={"v": 1})
    with pytest.raises(TypeError, match="JSON"):
        index.save(path, meta={"v": object()})
    with pytest.raises(TypeError, match="JSON"):
        index.save(path, meta={"v": float("nan")})
    assert FaissIndex.read_meta(path) == {"v": 1}
    index.remove(["id0"])
    index.save(path, meta={"v": 2})
    assert FaissIndex.load(path).ids() == ["id1", "id2", "id3", "id4"]
    assert sorted(os.listdir(tmp_path)) == ["i.mvi"]


def test_save_into_unwritable_place_is_store_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    index, _ = filled(n=2)
    with pytest.raises(StoreError, match="cannot save"):
        index.save(blocker / "index.mvi")


def test_missing_file(tmp_path):
    with pytest.raises(IndexCorruptError, match="cannot read"):
        FaissIndex.load(tmp_path / "nope.mvi")
    with pytest.raises(IndexCorruptError, match="cannot read"):
        FaissIndex.read_meta(tmp_path / "nope.mvi")


@pytest.fixture
def saved(tmp_path):
    index, _ = filled("hnsw", n=30)
    index.remove(["id5"])
    path = tmp_path / "index.mvi"
    index.save(path, meta={"embedder": "e1"})
    return path


def test_every_flipped_byte_is_detected(saved):
    data = saved.read_bytes()
    header_end = 16 + int.from_bytes(data[8:12], "little")
    positions = sorted(
        {0, 7, 8, 9, 12, 13, 16, 20, header_end - 2, header_end, header_end + 1}
        | {len(data) // 2, len(data) - 40, len(data) - 1}
        | set(range(header_end, len(data), max(1, (len(data) - header_end) // 25)))
    )
    for pos in positions:
        corrupt = bytearray(data)
        corrupt[pos] ^= 0x20
        saved.write_bytes(bytes(corrupt))
        with pytest.raises(IndexCorruptError):
            FaissIndex.load(saved)
    saved.write_bytes(data)
    assert len(FaissIndex.load(saved)) == 29


def test_truncated_file(saved):
    data = saved.read_bytes()
    for size in (0, 5, 12, 16, 40, len(data) // 2, len(data) - 1):
        saved.write_bytes(data[:size])
        with pytest.raises(IndexCorruptError, match=r"truncated|not a marsys-mem"):
            FaissIndex.load(saved)
    saved.write_bytes(data + b"\0")
    with pytest.raises(IndexCorruptError, match="padded"):
        FaissIndex.load(saved)


def test_not_an_index_file(tmp_path):
    path = tmp_path / "x.mvi"
    path.write_bytes(b"hello world, this is not an index at all")
    with pytest.raises(IndexCorruptError, match="not a marsys-mem vector index"):
        FaissIndex.load(path)


def test_future_version_is_refused(saved):
    import struct
    import zlib

    data = saved.read_bytes()
    size = int.from_bytes(data[8:12], "little")
    header = json.loads(data[16 : 16 + size])
    header["version"] = FORMAT_VERSION + 1
    raw = json.dumps(header).encode()
    saved.write_bytes(
        data[:8] + struct.pack("<II", len(raw), zlib.crc32(raw)) + raw + data[16 + size :]
    )
    with pytest.raises(IndexCorruptError, match="format version 2"):
        FaissIndex.load(saved)


def test_wrong_expected_dim(saved):
    with pytest.raises(IndexCorruptError, match=f"stale .*dimension {DIM}, expected 384"):
        FaissIndex.load(saved, expected_dim=384)


def test_meta_mismatch_is_stale(saved):
    with pytest.raises(IndexCorruptError, match=r"stale .*embedder='e1' \(expected 'e2'\)"):
        FaissIndex.load(saved, expected_meta={"embedder": "e2"})
    with pytest.raises(IndexCorruptError, match=r"other=None"):
        FaissIndex.load(saved, expected_meta={"other": 1})
    assert len(FaissIndex.load(saved, expected_meta={"embedder": "e1"})) == 29


def test_index_corrupt_error_is_store_error(tmp_path):
    with pytest.raises(StoreError):
        FaissIndex.load(tmp_path / "missing")


async def test_async_save_load(tmp_path):
    index, _ = filled(n=4)
    await index.asave(tmp_path / "a.mvi", meta={"x": [1, 2]})
    loaded = await FaissIndex.aload(tmp_path / "a.mvi", expected_meta={"x": [1, 2]})
    assert loaded.ids() == index.ids()


# --------------------------------------------------------- threads


def test_single_thread_restores_omp_setting():
    before = faiss.omp_get_max_threads()
    with single_thread():
        assert faiss.omp_get_max_threads() == 1
    assert faiss.omp_get_max_threads() == before


def test_concurrent_add_and_search():
    # Linearizability check: once remove() has returned, no later search may return
    # that id. (Between add() and remove() the id is legitimately visible.)
    rng = np.random.default_rng(5)
    index = FaissIndex(DIM, "auto", hnsw_threshold=300)
    chunks = [unit(rng, 50) for _ in range(10)]
    errors: list[BaseException] = []
    removed: set[str] = set()
    added: set[str] = set()

    def writer() -> None:
        try:
            for n, chunk in enumerate(chunks):
                batch = [f"{n}-{i}" for i in range(50)]
                added.update(batch)
                index.add(batch, chunk)
                index.remove([f"{n}-0"])
                removed.add(f"{n}-0")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    query = unit(rng, 1)
    searches = 0
    while t.is_alive() or searches == 0:
        gone = set(removed)  # removals completed before this search started
        ids, scores = index.search(query, k=5)
        searches += 1
        hits = [i for i in ids[0] if i]
        assert not gone & set(hits)
        assert set(hits) <= added
        assert len(set(hits)) == len(hits)
        valid = scores[0][: len(hits)]
        assert all(valid[j] >= valid[j + 1] - 1e-6 for j in range(len(valid) - 1))
    t.join()
    assert not errors
    assert len(index) == 490
    assert index.kind == "hnsw"
    final, _ = index.search(query, k=490)
    assert not removed & set(final[0])


# ------------------------------------------------------ property tests

_pool = [f"p{i}" for i in range(24)]
_op = st.one_of(
    st.tuples(
        st.just("add"),
        st.lists(st.sampled_from(_pool), min_size=1, max_size=8, unique=True),
        st.integers(0, 2**32 - 1),
    ),
    st.tuples(
        st.just("remove"),
        st.lists(st.sampled_from([*_pool, "unknown"]), max_size=6),
        st.integers(0, 0),
    ),
)


def _apply(index: FaissIndex, model: dict, op: tuple) -> None:
    name, ids, seed = op
    if name == "add":
        vecs = np.random.default_rng(seed).uniform(-1, 1, (len(ids), DIM)).astype(np.float32)
        index.add(ids, vecs)
        model.update(zip(ids, vecs, strict=True))
    else:
        expected = len({i for i in ids if i in model})
        assert index.remove(ids) == expected
        for i in ids:
            model.pop(i, None)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(_op, max_size=15), k=st.integers(1, 30), seed=st.integers(0, 2**32 - 1))
def test_flat_search_matches_brute_force(ops, k, seed):
    index = FaissIndex(DIM, "flat")
    model: dict[str, np.ndarray] = {}
    queries = np.random.default_rng(seed).uniform(-1, 1, (3, DIM)).astype(np.float32)
    for op in ops:
        _apply(index, model, op)
        assert len(index) == len(model)
        assert set(index.ids()) == set(model)
        ids, scores = index.search(queries, k)
        assert scores.shape == (3, min(k, len(model)))
        for q, row, row_scores in zip(queries, ids, scores, strict=True):
            expected = brute_force(model, q, k)
            assert len(row) == len(expected)
            assert len(set(row)) == len(row)
            # same scores (ties may order ids differently), and each id's score is its own
            np.testing.assert_allclose(row_scores, [s for _, s in expected], atol=1e-4)
            for id_, score in zip(row, row_scores, strict=True):
                assert float(np.dot(model[id_], q)) == pytest.approx(float(score), abs=1e-4)


@settings(max_examples=30, deadline=None)
@given(ops=st.lists(_op, max_size=15), k=st.integers(1, 30))
def test_hnsw_and_auto_only_return_live_ids(ops, k):
    for index in (FaissIndex(DIM, "hnsw"), FaissIndex(DIM, "auto", hnsw_threshold=6)):
        model: dict[str, np.ndarray] = {}
        query = np.ones((1, DIM), np.float32)
        for op in ops:
            _apply(index, model, op)
            ids, scores = index.search(query, k)
            row = ids[0]
            assert set(row) <= set(model)
            assert len(set(row)) == len(row)
            assert len(row) <= min(k, len(model))
            assert scores.shape == (1, min(k, len(model)))
            assert np.all(np.diff(scores[0, : len(row)]) <= 1e-5)
            for id_, score in zip(row, scores[0], strict=True):
                assert float(np.dot(model[id_], query[0])) == pytest.approx(float(score), abs=1e-4)


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_rows_hold_while_the_layout_does_and_score_like_inner_products(kind):
    """rows() names where vectors are stored; the layout changes when one moves or goes
    (not on appends), and row_inner_products/row_scores read those rows."""
    index, model = filled(kind, n=40)
    query = unit(np.random.default_rng(8), 1)[0]
    ids = ["id3", "nope", "id39", "id0"]
    rows = index.rows(ids)
    assert rows[1] == -1
    assert (rows[[0, 2, 3]] >= 0).all()
    want = [model["id3"] @ query, np.nan, model["id39"] @ query, model["id0"] @ query]
    np.testing.assert_allclose(index.row_inner_products(rows, query), want, atol=1e-6)
    np.testing.assert_allclose(index.query_scores(query[None, :]).row_scores(rows), want, atol=1e-6)
    layout = index.layout
    index.add(["late"], unit(np.random.default_rng(9), 1))  # appended: nothing moves
    assert index.layout == layout
    np.testing.assert_allclose(index.row_inner_products(rows, query), want, atol=1e-6)
    index.remove(["id1"])  # flat: later rows move up; HNSW: a tombstone
    assert index.layout != layout
    layout = index.layout
    index.add(["id3"], unit(np.random.default_rng(10), 1))  # replaced: the old vector goes
    assert index.layout != layout
    with pytest.raises(EmbeddingError, match="dimension"):
        index.row_inner_products(rows, np.zeros(DIM + 1, dtype=np.float32))
