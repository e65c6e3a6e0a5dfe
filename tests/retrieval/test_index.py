"""K-Means determinism (resume tests need bit-identical re-clustering) and the scikit-learn backend's limits."""

from __future__ import annotations

import numpy as np
import pytest

from hf_cocodr.retrieval.index import kmeans
from hf_cocodr.utils import faiss_available

BACKENDS = ["torch", pytest.param("faiss", marks=pytest.mark.skipif(not faiss_available(), reason="no faiss"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cap", [None, 8])
def test_same_seed_same_clusters_bit_for_bit(backend, cap):
    x = np.random.default_rng(0).standard_normal((600, 12)).astype(np.float32)
    runs = [kmeans(x, 7, seed=11, niter=10, backend=backend, max_points_per_centroid=cap) for _ in range(2)]
    assert np.array_equal(runs[0][0], runs[1][0]) and np.array_equal(runs[0][1], runs[1][1])
    assert runs[0][0].dtype == np.float32 and runs[0][1].dtype == np.int64 and runs[0][1].shape == (600,)
    other = kmeans(x, 7, seed=12, niter=10, backend=backend, max_points_per_centroid=cap)
    assert not np.array_equal(runs[0][0], other[0])  # the seed matters


def test_spherical_needs_faiss():
    with pytest.raises(ValueError, match="spherical K-Means needs faiss"):
        kmeans(np.ones((4, 2), np.float32), 2, spherical=True, backend="torch")
