"""The vector index on real FAISS: exactness, recall, isolation, deletes, rebuilds."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cache.index import IndexConfig, NamespaceIndex
from cache.vector_index import VectorIndex

DIM = 384


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def random_unit(rng: np.random.Generator, n: int) -> np.ndarray:
    return unit(rng.standard_normal((n, DIM)))


def clustered(rng: np.random.Generator, centers: np.ndarray, n: int) -> np.ndarray:
    """Like sentence embeddings: topics (centers) with spread around them."""
    picks = centers[rng.integers(0, len(centers), n)]
    return unit(picks + 0.5 * random_unit(rng, n))


def ids(n: int, start: int = 0) -> list[str]:
    return [f"e{i}" for i in range(start, start + n)]


def brute_force(vectors: np.ndarray, query: np.ndarray, k: int) -> list[int]:
    return [int(i) for i in np.argsort(-(vectors @ query), kind="stable")[:k]]


def test_flat_search_returns_the_exact_nearest() -> None:
    rng = np.random.default_rng(1)
    vectors = random_unit(rng, 3000)
    index = VectorIndex(DIM)
    index.add("ns", ids(3000), vectors)
    for query in unit(vectors[:20] + 0.3 * random_unit(rng, 20)):
        hits = index.search("ns", query, 5)
        assert [h[0] for h in hits] == [f"e{i}" for i in brute_force(vectors, query, 5)]
        assert [h[1] for h in hits] == pytest.approx(sorted(vectors @ query)[::-1][:5], abs=1e-5)
    assert index.get("ns") is not None and index.get("ns").kind == "flat"  # type: ignore[union-attr]


def test_floor_and_accept_filter_results() -> None:
    rng = np.random.default_rng(2)
    vectors = random_unit(rng, 100)
    index = VectorIndex(DIM)
    index.add("ns", ids(100), vectors)
    assert [h[0] for h in index.search("ns", vectors[7], 3, floor=0.99)] == ["e7"]
    hits = index.search("ns", vectors[7], 3, accept=lambda i: i != "e7")
    assert "e7" not in [h[0] for h in hits] and len(hits) == 3


def test_approximate_index_recall_against_flat() -> None:
    rng = np.random.default_rng(3)
    centers = random_unit(rng, 200)
    vectors = clustered(rng, centers, 6000)
    index = VectorIndex(DIM, IndexConfig(flat_max=2000))
    index.add("ns", ids(6000), vectors)
    assert index.maintain() == 1
    assert index.get("ns").kind == "hnsw"  # type: ignore[union-attr]
    # Fresh queries from the same distribution, and paraphrase-like ones near stored vectors.
    queries = np.vstack(
        [clustered(rng, centers, 150), unit(vectors[:150] + 0.2 * random_unit(rng, 150))]
    )
    found = [index.search("ns", q, 1)[0][0] for q in queries]
    exact = [f"e{brute_force(vectors, q, 1)[0]}" for q in queries]
    recall = np.mean([a == b for a, b in zip(found, exact, strict=True)])
    assert recall >= 0.95, recall


def test_namespaces_are_a_hard_partition() -> None:
    rng = np.random.default_rng(4)
    vectors = random_unit(rng, 50)
    index = VectorIndex(DIM)
    index.add("a", ids(50), vectors)
    index.add("b", ids(5, start=100), vectors[:5])
    assert {h[0] for h in index.search("b", vectors[30], 10)} == set(ids(5, start=100))
    assert index.search("c", vectors[0], 10) == []
    assert sorted(index.namespaces()) == ["a", "b"] and len(index) == 55


def test_delete_skips_tombstones_even_when_they_crowd_the_top() -> None:
    rng = np.random.default_rng(5)
    base = random_unit(rng, 1)[0]
    near = unit(base + 0.05 * random_unit(rng, 200))  # 200 near-duplicates of one prompt
    far = random_unit(rng, 800)
    index = VectorIndex(DIM)
    index.add("ns", ids(200) + ids(800, start=200), np.vstack([near, far]))
    assert index.remove("ns", ids(195)) == 195
    hits = index.search("ns", base, 10)
    assert {h[0] for h in hits[:5]} == set(ids(5, start=195))
    assert len(hits) == 10 and not {h[0] for h in hits} & set(ids(195))
    assert index.remove("ns", ["e0", "missing"]) == 0


def test_compaction_and_kind_switch_keep_results() -> None:
    rng = np.random.default_rng(6)
    vectors = random_unit(rng, 3000)
    index = VectorIndex(DIM, IndexConfig(flat_max=2000))
    index.add("ns", ids(3000), vectors)
    index.maintain()
    ns = index.get("ns")
    assert ns is not None and ns.kind == "hnsw"
    index.remove("ns", ids(2500))  # below flat_max / 2: back to an exact index
    assert ns.needs_rebuild() and index.maintain() == 1
    assert ns.kind == "flat" and len(ns) == 500 and not ns.needs_rebuild()
    for i in (2500, 2750, 2999):
        assert index.search("ns", vectors[i], 1)[0][0] == f"e{i}"


def test_adds_and_removes_during_a_rebuild_are_kept() -> None:
    rng = np.random.default_rng(7)
    vectors = random_unit(rng, 3500)
    ns = NamespaceIndex(DIM, IndexConfig(flat_max=1000), gpu=None)
    ns.add(ids(3000), vectors[:3000])
    builder = threading.Thread(target=ns.rebuild)
    builder.start()
    during = 0
    for n in range(3000, 3500, 10):  # interleaved with the HNSW build
        during += builder.is_alive()
        ns.add(ids(10, start=n), vectors[n : n + 10])
        ns.remove(ids(10, start=n - 3000))
    builder.join()
    assert during > 10
    assert ns.kind == "hnsw" and len(ns) == 3000
    for i in range(0, 3500, 97):
        near = [h[0] for h in ns.search(vectors[i], 10)]
        assert (f"e{i}" in near) == (i >= 500), i  # removed ones never come back


def test_readding_an_id_keeps_the_first_vector_and_drop_forgets() -> None:
    rng = np.random.default_rng(8)
    vectors = random_unit(rng, 2)
    index = VectorIndex(DIM)
    assert index.add("ns", ["x", "x"], vectors) == 1
    assert index.add("ns", ["x"], vectors[1]) == 0
    assert index.search("ns", vectors[0], 1)[0][0] == "x"
    assert index.drop("ns") == ["x"] and index.search("ns", vectors[0], 1) == []
    index.add("ns", ["y"], vectors[1])  # a dropped namespace comes back fresh
    assert index.search("ns", vectors[1], 5) == [("y", pytest.approx(1.0, abs=1e-5))]
    index.remove("ns", ["y"])
    index.maintain()
    assert index.get("ns") is None and index.namespaces() == []


def test_wrong_dimension_is_refused() -> None:
    index = VectorIndex(DIM)
    with pytest.raises(ValueError, match="dimension"):
        index.add("ns", ["x"], np.zeros(DIM + 1, np.float32))
    with pytest.raises(ValueError, match="ids for"):
        index.add("ns", ["x", "y"], np.zeros((1, DIM), np.float32))


def test_a_quick_search_is_answered_now_and_a_slow_or_busy_one_declined() -> None:
    rng = np.random.default_rng(7)
    small, large = random_unit(rng, 100), random_unit(rng, 16_500)
    index = VectorIndex(DIM)
    index.add("small", ids(100), small)
    index.add("large", ids(16_500), large)

    def now(namespace: str, query: np.ndarray) -> list[tuple[str, float]] | None:
        found = index.search_many_now(namespace, query[None], 1, -1.0, [lambda i: True])
        return None if found is None else found[0]

    assert now("small", small[3]) == index.search("small", small[3], 1)
    assert now("none", small[3]) == []
    # A flat scan this long would hold the event loop: the caller goes to a thread.
    assert now("large", large[3]) is None
    assert index.search("large", large[3], 1)[0][0] == "e3"
    namespace = index.get("small")
    assert namespace is not None
    with namespace._lock:  # an add or a rebuild's copy holds the index
        assert now("small", small[3]) is None


def test_many_searches_in_one_call_find_what_each_finds_alone() -> None:
    rng = np.random.default_rng(11)
    vectors = random_unit(rng, 2000)
    index = VectorIndex(DIM)
    index.add("ns", ids(2000), vectors)
    # Near neighbours of the first queries removed: their rows must fetch past tombstones.
    for q in range(3):
        index.remove("ns", [f"e{i}" for i in brute_force(vectors, vectors[q], 40)[1:]])
    queries = vectors[:8]
    accepts = [lambda i: True] * 7 + [lambda i: i != "e7"]  # the last refuses its own id
    many = index.search_many_now("ns", queries, 5, -1.0, accepts)
    alone = [index.search("ns", q, 5, -1.0, a) for q, a in zip(queries, accepts, strict=True)]
    assert many == alone
    assert [hits[0][0] for hits in many[:7]] == ids(7) and many[7][0][0] != "e7"
    assert index.search_many_now("none", queries, 5, -1.0, accepts) == [[]] * 8
    namespace = index.get("ns")
    assert namespace is not None
    with namespace._lock:  # busy: the callers search one by one in threads
        assert index.search_many_now("ns", queries, 5, -1.0, accepts) is None
