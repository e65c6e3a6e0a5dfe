"""The K-Means and negatives-refresh callbacks work with what they are handed (an encoder function, the rows, the
cluster assignment, the loss): no trainer anywhere."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import TrainerControl, TrainerState

from hf_cocodr import RetrievalTrainingData, load_encoder
from hf_cocodr.finetuning import HardNegativeRefreshCallback, KMeansClusteringCallback
from hf_cocodr.finetuning.checkpoint_state import ClusterAssignment


class WeightsSpy:
    """A stand-in for the loss whose cluster weights K-Means carries over (records the calls it gets)."""

    num_clusters = 3

    def __init__(self):
        self.calls = []

    def remap_clusters(self, mapping, k):
        self.calls.append((None if mapping is None else mapping.tolist(), k))


def blobs(order):
    """12 points in three far-apart groups of 4, the groups in ``order``."""
    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0], [100.0, 0.0], [0.0, 100.0]], dtype=np.float32)
    return np.concatenate([centers[g] + rng.standard_normal((4, 2)).astype(np.float32) for g in order])


def test_kmeans_clusters_through_its_encoder_and_updates_what_it_is_handed():
    embeddings = {"now": blobs([0, 1, 2])}
    asked = []

    def encode(lo, hi, batch_size):
        asked.append((lo, hi, batch_size))
        return embeddings["now"][lo:hi]

    clusters, spy = ClusterAssignment(12), WeightsSpy()
    cb = KMeansClusteringCallback(num_clusters=3, every_steps=2, batch_size=5, backend="torch")
    # seed 3 (then 4): scikit-learn's random initial centroids fall in three different groups both times
    cb.bind(encode=encode, num_queries=12, clusters=clusters, loss=spy, seed=3)
    assert not hasattr(cb, "trainer")
    state, control = TrainerState(), TrainerControl()
    state.global_step, state.max_steps = 0, 10
    cb.on_train_begin(None, state, control)
    assert asked == [(0, 12, 5)]
    groups = clusters.ids.reshape(3, 4)
    assert all(len(set(g)) == 1 for g in groups.tolist()) and len(set(groups[:, 0])) == 3
    first = clusters.ids.copy()
    embeddings["now"] = blobs([1, 2, 0])  # the same three places, the queries moved between them
    state.global_step = 2
    cb.on_step_end(None, state, control)
    assert cb.count == 2 and [h["step"] for h in cb.history] == [0, 2]
    # the weights followed the matched centroids: row group 0 now sits where group 1 sat, and so on
    mapping, k = spy.calls[-1]
    assert k == 3 and sorted(mapping) == [0, 1, 2]
    assert [mapping[c] for c in clusters.ids[[0, 4, 8]]] == first[[4, 8, 0]].tolist()


def test_kmeans_unbound_says_so():
    with pytest.raises(RuntimeError, match="not bound"):
        KMeansClusteringCallback(num_clusters=2).cluster("test")


def test_the_refresh_mines_into_the_rows_and_reclusters_with_its_embeddings(tiny_st_dir, tiny_beir):
    model = load_encoder(str(tiny_st_dir))
    data = RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="bm25")
    before = data.neg_idx.copy()

    def no_encoding(lo, hi, batch_size):
        raise AssertionError("the refresh hands K-Means its query embeddings")

    clusters = ClusterAssignment(len(data))
    km = KMeansClusteringCallback(num_clusters=3, backend="torch")
    km.bind(encode=no_encoding, num_queries=len(data), clusters=clusters)
    groups = []
    refresh = HardNegativeRefreshCallback(every_steps=2, top_k=6, recluster=True)
    refresh.bind(model=model, rows=data, use_row_group=groups.append, kmeans=km)
    assert not hasattr(refresh, "trainer") and refresh.reclusters_at(4) and not refresh.reclusters_at(3)
    state, control = TrainerState(), TrainerControl()
    state.global_step, state.max_steps = 2, 10
    refresh.on_step_end(None, state, control)
    assert data.negatives_source == "self-mined@2" and refresh.count == 1
    assert not np.array_equal(before, data.neg_idx) or len(before) != len(data.neg_idx)
    assert km.count == 1 and km.history[0]["reason"] == "negatives refresh at step 2"
    assert len(clusters.ids) == len(data) and set(clusters.ids.tolist()) <= {0, 1, 2}
    assert groups == []  # plain rows: no row group to switch to
