"""bf16 autocast gives the fp32 answers within bf16 tolerance (correctness only; whether bf16 *pays* is a benchmark,
``scripts/benchmarks/bench_precision.py``: on CPUs without native bf16 kernels it is many times slower, see the README)."""

from __future__ import annotations

import helpers
import pytest
import torch
from helpers import batch, features_for, grads_after_step

from hf_cocodr import IDROLoss


def _gram_and_weights(model, autocast: bool):
    loss = IDROLoss(model, preset="paper", num_clusters=3, tau=1.0, beta=0.5)
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 2, 2])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        value = loss(features_for(model, batch()), labels)
    value.backward()
    model.zero_grad(set_to_none=True)
    return loss.last_stats["grad_gram"], loss.log_weights.detach().clone(), value


def test_idro_gram_and_weight_update_under_bf16_autocast(minilm_dir):
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(str(minilm_dir))
    model.eval()  # no dropout: both runs see the same network
    g32, w32, _ = _gram_and_weights(model, autocast=False)
    g16, w16, value16 = _gram_and_weights(model, autocast=True)
    assert g32.shape == g16.shape == (3, 3)
    assert g16.dtype in (torch.float32, torch.float64) and w16.dtype in (torch.float32, torch.float64), (
        "the Gram matrix and the cluster weights stay in full precision"
    )
    assert torch.isfinite(value16)
    scale = float(g32.abs().max())
    assert scale > 0
    assert float((g16.double() - g32.double()).abs().max()) <= 2e-2 * scale
    # the same update direction of the cluster log-weights (from uniform)
    start = torch.full_like(w32, -torch.log(torch.tensor(3.0)).item())
    d32, d16 = (w32 - start).double(), (w16 - start).double()
    assert float(d32.norm()) > 0
    assert torch.nn.functional.cosine_similarity(d32, d16, dim=0) > 0.99
    assert torch.equal(torch.argsort(d32), torch.argsort(d16))


def test_idro_cluster_statistics_stay_fp32_under_autocast(tiny_st_dir):
    """The per-cluster losses behind the Gram and the weights are computed in fp32 even under bf16 autocast (in bf16
    they rounded to one value and the tiny model's Gram came out ~1000x too large)."""
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(str(tiny_st_dir))
    model.eval()
    loss = IDROLoss(model, preset="paper", num_clusters=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss(features_for(model, batch()), torch.tensor([0, 1, 0, 2, 1, 0, 2, 2])).backward()
    stats = loss.last_stats
    assert stats["cluster_losses"].dtype == torch.float32
    assert stats["grad_gram"].dtype == torch.float64 and loss.log_weights.dtype == torch.float64


@pytest.fixture(scope="module")
def tiny_bert_nodrop(tmp_path_factory):
    import tiny

    return tiny.make_tiny_bert(tmp_path_factory.mktemp("nodrop"), dropout=0.0, seed=3)


def test_coco_gradient_cache_equals_uncached_under_bf16(tiny_bert_nodrop, tiny_beir, tmp_path, monkeypatch):
    """The grad-cache equivalence, with the trainers' --bf16 (accelerate's autocast) on CPU: bf16 tolerance."""
    real = helpers.coco_args
    monkeypatch.setattr(helpers, "coco_args", lambda out, **kw: real(out, bf16=True, **kw))
    _, g_plain = grads_after_step(tiny_bert_nodrop, tiny_beir, tmp_path / "a", chunk=0)
    tr, g_cache = grads_after_step(tiny_bert_nodrop, tiny_beir, tmp_path / "b", chunk=3)
    assert tr.args.bf16
    assert g_plain.keys() == g_cache.keys() and len(g_plain) > 20
    total = torch.cat([g.flatten().float() for g in g_plain.values()])
    diff = torch.cat([(g_plain[n] - g_cache[n]).flatten().float() for n in g_plain])
    assert float(diff.norm() / total.norm()) < 5e-2
