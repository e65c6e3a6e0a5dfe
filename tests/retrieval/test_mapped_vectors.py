"""Vectors on disk: a memory-mapped vector file holds exactly the vectors written to it (float16 to fp16's
precision), block-wise search over it ranks as exact search does, a saved hybrid loaded memory-mapped searches as the
built one, a truncated file is refused with one line naming it, and BM25 loaded memory-mapped ranks as in memory."""

from __future__ import annotations

import numpy as np
import pytest

import hf_cocodr.retrieval.hybrid as hybrid_module
from hf_cocodr.errors import ConfigError
from hf_cocodr.retrieval.hybrid import EMBEDDINGS_FILE, HybridRetriever
from hf_cocodr.retrieval.index import BM25Index, DenseIndex
from hf_cocodr.retrieval.session import EncodingSession
from hf_cocodr.retrieval.vectors import MappedIndex, VectorWriter, as_stored, open_vectors

QUERIES = ["heart artery blood pressure", "planet orbit telescope", "bread cheese oven", "neuron memory cortex"]


pytestmark = pytest.mark.usefixtures("own_cache")  # each test its own cache (tests/conftest.py)


def _random(n: int, dim: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_the_mapped_vectors_are_the_ones_written_in_any_order(tmp_path, dtype):
    x = _random(300, 12)
    out = VectorWriter(tmp_path / "v.npy", 300, 12, dtype)
    assert not (tmp_path / "v.npy").exists()  # staged until committed
    order = np.random.default_rng(1).permutation(300)
    for s in range(0, 300, 64):  # out of order, in pieces
        rows = order[s : s + 64]
        out.write(rows, as_stored(x[rows], np.dtype(dtype)))
    out.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.npy"]  # no staging file left
    got = open_vectors(tmp_path / "v.npy", 300, 12)
    assert isinstance(got, np.memmap) and got.dtype == dtype
    assert np.array_equal(np.asarray(got, np.float32), as_stored(x, np.dtype(dtype)))
    assert np.array_equal(np.load(tmp_path / "v.npy"), got)  # a plain .npy
    if dtype == np.float32:
        assert np.array_equal(got, x)
    else:
        np.testing.assert_allclose(np.asarray(got, np.float32), x, rtol=2**-11, atol=2**-24)


def test_a_discarded_writer_leaves_nothing(tmp_path):
    out = VectorWriter(tmp_path / "v.npy", 10, 4)
    out.write(slice(0, 5), _random(5, 4))
    out.discard()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("backend", ["faiss", "torch"])
@pytest.mark.parametrize("k", [1, 10, 150, 2000])
def test_block_wise_search_is_exact_search(tmp_path, backend, k):
    """Blocks of 128 rows over 1,000 vectors (the last one short), k within a block, over a block and over n."""
    x, q = _random(1000, 16), _random(37, 16, seed=2)
    exact = DenseIndex(16, backend=backend)
    exact.add(x)
    np.save(tmp_path / "v.npy", x)
    mapped = MappedIndex(open_vectors(tmp_path / "v.npy", 1000, 16), block_rows=128, backend=backend)
    want_s, want_i = exact.search(q, k)
    got_s, got_i = mapped.search(q, k)
    assert got_i.shape == want_i.shape == (37, min(k, 1000))
    assert np.array_equal(got_i, want_i) and np.array_equal(got_s, want_s)  # each block scored as the index does
    assert np.array_equal(mapped.reconstruct_all(), x)


def test_equal_scores_are_ordered_by_row():
    x = np.repeat(_random(3, 8), 4, axis=0)  # each vector four times
    _, rows = MappedIndex(x, block_rows=5).search(x[:1], 4)
    assert sorted(rows[0].tolist()) == rows[0].tolist()


def _hybrid(tiny_st_dir, tiny_beir, **kw):
    from hf_cocodr.modeling.loading import load_encoder

    return HybridRetriever.build(load_encoder(str(tiny_st_dir)), tiny_beir, index="exact", **kw)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_saved_hybrid_loaded_memory_mapped_searches_as_the_built_one(
    tiny_st_dir, tiny_beir, tmp_path, monkeypatch, precision
):
    built = _hybrid(tiny_st_dir, tiny_beir, session=EncodingSession(precision))
    built.save(tmp_path / "h")
    monkeypatch.setattr(hybrid_module, "MAPPED_MIN_DOCS", 0)  # any size is searched where it lies
    loaded = HybridRetriever.load(tmp_path / "h", built.model, session=EncodingSession(precision))
    assert isinstance(loaded.dense_index, MappedIndex) and isinstance(loaded.embeddings, np.memmap)
    assert loaded.embeddings.dtype == (np.float16 if precision == "bf16" else np.float32)
    assert np.array_equal(np.asarray(loaded.embeddings, np.float32), built.embeddings)  # bf16: already fp16-exact
    for k in (3, 10, 1000):
        want_ids, want_scores = built.search(QUERIES, k=k)
        got_ids, got_scores = loaded.search(QUERIES, k=k)
        assert got_ids == want_ids
        for a, b in zip(got_scores, want_scores):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(hybrid_module, "MAPPED_MIN_DOCS", 10**9)
    assert not isinstance(HybridRetriever.load(tmp_path / "h", built.model).dense_index, MappedIndex)


@pytest.mark.parametrize("mapped", [True, False])
def test_a_truncated_vector_file_is_refused_with_one_line_naming_it(
    tiny_st_dir, tiny_beir, tmp_path, monkeypatch, mapped
):
    built = _hybrid(tiny_st_dir, tiny_beir)
    built.save(tmp_path / "h")
    file = tmp_path / "h" / EMBEDDINGS_FILE
    with open(file, "r+b") as f:
        f.truncate(file.stat().st_size - 10)
    monkeypatch.setattr(hybrid_module, "MAPPED_MIN_DOCS", 0 if mapped else 10**9)
    with pytest.raises(ConfigError) as e:
        HybridRetriever.load(tmp_path / "h", built.model)
    message = str(e.value)
    assert "\n" not in message and str(file) in message and "truncated" in message


def test_a_non_finite_mapped_vector_is_refused_at_search_naming_the_file(
    tiny_st_dir, tiny_beir, tmp_path, monkeypatch
):
    built = _hybrid(tiny_st_dir, tiny_beir)
    built.save(tmp_path / "h")
    file = tmp_path / "h" / EMBEDDINGS_FILE
    x = np.load(file, mmap_mode="r+")
    x[3, 0] = np.nan
    x.flush()
    del x
    monkeypatch.setattr(hybrid_module, "MAPPED_MIN_DOCS", 0)
    loaded = HybridRetriever.load(tmp_path / "h", built.model)  # constant time: nothing read yet
    with pytest.raises(ConfigError, match="vector 3 is not finite") as e:
        loaded.search(QUERIES, k=3)
    assert str(file) in str(e.value)


def test_a_bf16_encoding_is_cached_as_float16_and_read_back_as_encoded(tiny_st_dir, tiny_beir, tmp_path):
    from hf_cocodr.data.beir import load_corpus
    from hf_cocodr.modeling.loading import load_encoder
    from hf_cocodr.retrieval.encoding import build_index

    model, corpus = load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir)
    fresh, order = build_index(model, corpus, show_progress_bar=False, session=EncodingSession("bf16", cache=True))
    (file,) = (tmp_path / "cache").rglob("embeddings.npy")
    on_disk = np.load(file, mmap_mode="r")
    assert on_disk.dtype == np.float16
    assert np.array_equal(np.asarray(on_disk, np.float32)[order], fresh.reconstruct_all())
    again, _ = build_index(model, corpus, show_progress_bar=False, session=EncodingSession("bf16", cache=True))
    assert np.array_equal(again.reconstruct_all(), fresh.reconstruct_all())


def test_bm25_loaded_memory_mapped_ranks_as_in_memory(tiny_beir, tmp_path):
    from hf_cocodr.retrieval.hybrid import _corpus_ids_texts

    _, texts = _corpus_ids_texts(tiny_beir)
    index = BM25Index(texts)
    index.save(tmp_path / "bm25")
    in_memory = BM25Index.load(tmp_path / "bm25", index.config())
    mapped = BM25Index.load(tmp_path / "bm25", index.config(), mmap=True)
    assert isinstance(mapped.retriever.scores["data"], np.memmap)
    for k in (1, 5, 50):
        want = index.search(QUERIES, k)
        for got in (in_memory.search(QUERIES, k), mapped.search(QUERIES, k)):
            assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])


def test_open_vectors_refuses_other_rows_or_dimension(tmp_path):
    np.save(tmp_path / "v.npy", _random(5, 4))
    with pytest.raises(ConfigError, match="5 vectors of dimension 4, expected 6"):
        open_vectors(tmp_path / "v.npy", 6)
    np.save(tmp_path / "i.npy", np.zeros((5, 4), np.int64))
    with pytest.raises(ConfigError, match="int64"):
        open_vectors(tmp_path / "i.npy", 5)
