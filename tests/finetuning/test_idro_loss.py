from __future__ import annotations

import math

import pytest
import torch
from helpers import batch, features_for

from hf_cocodr.finetuning.losses import IDROLoss


@pytest.fixture()
def st_model(tiny_st_dir):
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    m = SentenceTransformer(str(tiny_st_dir))
    m.train()
    return m


def grads_of(model, loss_value):
    model.zero_grad()
    loss_value.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_uniform_equals_mnrl(st_model):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    st_model.eval()  # no dropout: the two losses see identical embeddings
    cols = batch()
    feats = features_for(st_model, cols)
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 2, 2])
    ours = IDROLoss(st_model, preset="uniform", num_clusters=3, similarity="dot", scale=1.0)
    mnrl = MultipleNegativesRankingLoss(st_model, scale=1.0, similarity_fct=lambda a, b: a @ b.T)
    g1 = grads_of(st_model, ours(feats, labels))
    g2 = grads_of(st_model, mnrl(features_for(st_model, cols), None))
    assert g1.keys() == g2.keys() and len(g1) > 10
    for n in g1:
        torch.testing.assert_close(g1[n], g2[n], rtol=1e-5, atol=1e-7, msg=n)


def naive_gram(model, loss, feats, labels):
    ell = loss.per_sample_loss(feats, labels)
    present = torch.unique(labels)
    named = dict(model.named_parameters())
    params = [named[n] for n in loss.last_stats["grad_param_names"]]
    vecs = []
    for c in present:
        li = ell[labels == c].mean()
        gs = torch.autograd.grad(li, params, retain_graph=True, allow_unused=True)
        vecs.append(torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(gs, params)]))
    v = torch.stack(vecs).double()
    return v @ v.T


@pytest.mark.parametrize("grad_params", ["auto", "last_layer", "last_norm", "last_blocks:2"])
@pytest.mark.parametrize("dropout_on", [False, True])
def test_grad_gram_equals_naive(st_model, grad_params, dropout_on):
    # in double precision: the untrained tiny model's embeddings are nearly equal, so a float32 gradient of the loss
    # w.r.t. them loses ~1e-4 of its digits to cancellation (the closed-form cotangents are computed in double)
    st_model.double().train(dropout_on)
    cols = batch(10, seed=1)
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 2, 2, 4, 1])
    loss = IDROLoss(st_model, preset="paper", num_clusters=5, grad_params=grad_params)
    feats = features_for(st_model, cols)
    torch.manual_seed(123)
    loss(feats, labels)
    gram = loss.last_stats["grad_gram"]
    torch.manual_seed(123)  # same dropout masks in the naive recomputation
    ref = naive_gram(st_model, loss, features_for(st_model, cols), labels)
    assert gram.shape == (4, 4)
    assert loss.last_stats["cluster_ids"].tolist() == [0, 1, 2, 4]
    rel = (gram - ref).abs().max() / ref.abs().max()
    assert rel < 1e-4, (grad_params, rel)
    if grad_params in ("auto", "last_layer"):
        assert loss.subset.fast


def test_stats_contract(st_model):
    loss = IDROLoss(st_model, preset="paper", num_clusters=4)
    labels = torch.tensor([3, 3, 1, 1, 1, 0, 3, 1])
    loss(features_for(st_model, batch()), labels)
    s = loss.last_stats
    for key in ("cluster_ids", "cluster_losses", "alpha", "weights", "grad_gram", "grad_param_names"):
        assert key in s
    assert s["cluster_ids"].tolist() == [0, 1, 3]
    assert s["cluster_sizes"].tolist() == [1, 4, 3]
    named = dict(st_model.named_parameters())
    assert all(n in named for n in s["grad_param_names"])
    assert loss.weights.sum().item() == pytest.approx(1.0)
    assert s["alpha"].sum().item() == pytest.approx(1.0, abs=1e-6)


def make_loss(st_model, **kw):
    return IDROLoss(st_model, num_clusters=4, **kw)


def test_paper_update_hand_computed(st_model):
    loss = make_loss(st_model, preset="paper", beta=0.5, tau=2.0)
    present = torch.tensor([0, 2])
    ell = torch.tensor([1.0, 4.0], dtype=torch.float64)
    gram = torch.tensor([[2.0, -1.0], [-1.0, 3.0]], dtype=torch.float64)
    alpha = loss._alpha(ell)
    assert alpha.tolist() == pytest.approx([1 / 3, 2 / 3])  # sqrt(1)=1, sqrt(4)=2
    coef = loss._update_and_coefficients(present, ell, alpha, gram)
    # r_ij = sqrt(l_i l_j) * G_ij: r = [[1*2, 2*-1], [2*-1, 4*3]] -> row sums [0, 10]; /tau -> [0, 5]
    logw = torch.full((4,), -math.log(4), dtype=torch.float64)
    logw[2] += 5.0
    expected = torch.softmax(logw, 0)
    torch.testing.assert_close(loss.weights, expected)
    w0, w2 = expected[0], expected[2]
    c = torch.tensor([alpha[0] * w0, alpha[1] * w2])
    torch.testing.assert_close(coef, c / c.sum())


def test_diag_normalised_gram_is_the_raw_rule_at_tau_times_the_mean_diagonal(st_model):
    """gram_normalization="diag": the same hand-made case as above, the Gram divided by its mean diagonal 2.5, gives
    row sums [0, 4] / tau = [0, 2] at tau 2; and it equals the raw rule at tau 2 x 2.5 exactly."""
    present = torch.tensor([0, 2])
    ell = torch.tensor([1.0, 4.0], dtype=torch.float64)
    gram = torch.tensor([[2.0, -1.0], [-1.0, 3.0]], dtype=torch.float64)
    normed = make_loss(st_model, preset="paper", beta=0.5, tau=2.0, gram_normalization="diag")
    coef = normed._update_and_coefficients(present, ell, normed._alpha(ell), gram)
    logw = torch.full((4,), -math.log(4), dtype=torch.float64)
    logw[2] += 2.0
    torch.testing.assert_close(normed.weights, torch.softmax(logw, 0))
    raw = make_loss(st_model, preset="paper", beta=0.5, tau=5.0)
    torch.testing.assert_close(raw._update_and_coefficients(present, ell, raw._alpha(ell), gram), coef)
    torch.testing.assert_close(raw.weights, normed.weights)
    with pytest.raises(ValueError, match="gram_normalization"):
        make_loss(st_model, preset="paper", gram_normalization="trace")


def test_reference_update_hand_computed(st_model):
    loss = make_loss(st_model, preset="reference", beta=0.25)
    present = torch.tensor([1, 3])
    ell = torch.tensor([1.0, 16.0], dtype=torch.float64)
    gram = torch.tensor([[4.0, 2.0], [2.0, 9.0]], dtype=torch.float64)
    coef = loss._update_and_coefficients(present, ell, loss._alpha(ell), gram)
    assert coef.tolist() == pytest.approx([0.25, 0.25])  # previous (uniform) weights, no alpha
    cos = torch.tensor([[1.0, 2.0 / 6.0], [2.0 / 6.0, 1.0]], dtype=torch.float64)
    s = torch.tensor([1.0, 2.0], dtype=torch.float64)  # ell ** 0.25
    e = 0.05 * (s[:, None] * s[None, :] * cos).sum(1) / 4
    w = torch.zeros(4, dtype=torch.float64)
    w[present] = 0.25**0.1 * torch.exp(e)
    w = (w / w.sum()).clamp(min=0.01)
    torch.testing.assert_close(loss.weights, w)
    assert loss.weights[0].item() == pytest.approx(0.01)  # absent clusters floored


def test_groupdro_update(st_model):
    loss = make_loss(st_model, preset="groupdro", groupdro_step_size=0.5)
    coef = loss._update_and_coefficients(
        torch.tensor([0, 1]), torch.tensor([1.0, 3.0], dtype=torch.float64), None, None
    )
    logw = torch.full((4,), -math.log(4), dtype=torch.float64)
    logw[0] += 0.5
    logw[1] += 1.5
    w = torch.softmax(logw, 0)
    torch.testing.assert_close(loss.weights, w)
    torch.testing.assert_close(coef, w[:2] / w[:2].sum())


def test_tau_infinite_freezes_weights_and_tiny_tau_is_finite(st_model):
    feats = features_for(st_model, batch())
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 2, 2])
    frozen = IDROLoss(st_model, preset="paper", num_clusters=3, tau=float("inf"))
    frozen.set_log_weights(torch.log(torch.tensor([0.5, 0.3, 0.2])))
    before = frozen.weights.clone()
    frozen(feats, labels)
    torch.testing.assert_close(frozen.weights, before)
    tiny_tau = IDROLoss(st_model, preset="paper", num_clusters=3, tau=1e-30)
    out = tiny_tau(features_for(st_model, batch()), labels)
    assert torch.isfinite(out) and torch.isfinite(tiny_tau.weights).all()
    assert tiny_tau.weights.sum().item() == pytest.approx(1.0)


def test_absent_clusters_keep_relative_weights(st_model):
    loss = IDROLoss(st_model, preset="paper", num_clusters=6, tau=0.5)
    loss(features_for(st_model, batch()), torch.tensor([0, 1, 0, 1, 1, 0, 1, 0]))
    w = loss.weights
    # clusters 2..5 were absent: they keep equal weights among themselves, no NaN
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w[2:], w[2].expand(4))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tau": 0}, "tau must be > 0"),
        ({"tau": -1.0}, "tau must be > 0"),
        ({"beta": -0.1}, "beta must be"),
        ({"preset": "nope"}, "preset must be one of"),
        ({"grad_params": "last_blocks:99"}, "N must be in"),
        ({"grad_params": ["not.a.param"]}, "unknown parameter names"),
    ],
)
def test_bad_arguments(st_model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        IDROLoss(st_model, **kwargs)


def test_labelled_positives_are_not_negatives(st_model):
    """With pos_keys, a document that is a positive of the query is masked out of its negatives."""
    st_model.eval()
    cols = batch(4)
    cols[1][1] = cols[1][0]  # rows 0 and 1 share the same positive document
    feats = features_for(st_model, cols)
    labels = torch.zeros(4, dtype=torch.long)
    loss = IDROLoss(st_model, preset="uniform", num_clusters=1)
    ell = loss.per_sample_loss(feats, labels)
    # reference: row 0's candidate set without row 1's copy of its positive
    embs = [st_model(f)["sentence_embedding"] for f in features_for(st_model, cols)]
    q, c = embs[0], torch.cat(embs[1:])
    logits = q @ c.T
    mask = torch.ones_like(logits, dtype=torch.bool)
    mask[0, 1] = False
    mask[1, 0] = False
    expected = torch.logsumexp(logits.masked_fill(~mask, -float("inf")), 1) - logits[torch.arange(4), torch.arange(4)]
    torch.testing.assert_close(ell, expected, rtol=1e-5, atol=1e-5)


def test_reference_rule_on_the_cheap_gram_equals_per_cluster_backwards(st_model):
    """The reference preset (cosine of cluster gradients, ω^0.1 pull to uniform, floor 0.01) from the pooled-position
    Gram equals the same rule from one backward per cluster over the same parameters (the default subset), over two
    steps (the second starts from the first's ω); and its ω is the rule worked through by hand on the naive Gram."""
    st_model.double().eval()
    cols = batch(10, seed=1)
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 2, 2, 4, 1])
    cheap = IDROLoss(st_model, preset="reference", num_clusters=5)
    naive = IDROLoss(st_model, preset="reference", num_clusters=5, gram_engine="autograd")
    assert cheap.subset.fast and not naive.subset.fast and cheap.subset.names == naive.subset.names
    for _ in range(2):
        prev = cheap.weights.clone()
        values = [loss(features_for(st_model, cols), labels) for loss in (cheap, naive)]
        torch.testing.assert_close(values[0], values[1], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(cheap.last_stats["grad_gram"], naive.last_stats["grad_gram"], rtol=1e-8, atol=0)
        torch.testing.assert_close(cheap.weights, naive.weights, rtol=1e-10, atol=0)
        # by hand from the per-cluster backward Gram: cos, e_i = ρ/K Σ_j (ℓ_iℓ_j)^β cos_ij, ω^0.1·exp(e), floor
        gram = naive_gram(st_model, naive, features_for(st_model, cols), labels)
        d = gram.diagonal().sqrt()
        cos = gram / (d[:, None] * d[None, :])
        ell = cheap.last_stats["cluster_losses"].double() ** 0.25
        e = 0.05 * (ell[:, None] * ell[None, :] * cos).sum(1) / 5
        w = torch.zeros(5, dtype=torch.float64)
        present = torch.tensor([0, 1, 2, 4])
        w[present] = prev[present] ** 0.1 * torch.exp(e)
        torch.testing.assert_close(cheap.weights, (w / w.sum()).clamp(min=0.01), rtol=1e-8, atol=0)
        assert cheap.weights[3].item() == pytest.approx(0.01)  # the absent cluster, floored


@pytest.mark.parametrize("similarity", ["dot", "cosine"])
def test_closed_form_cotangents_equal_autograd(similarity):
    """∂(Σ_b w_pb ℓ_b)/∂q and /∂c for every row p at once (what the Gram starts from) == batched autograd."""
    from hf_cocodr.finetuning.losses.infonce import infonce_cotangents, per_sample_infonce

    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 5, dtype=torch.float64, generator=g, requires_grad=True)
    c = torch.randn(12, 5, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 12, (6,), generator=g)
    allowed = torch.rand(6, 12, generator=g) > 0.3
    allowed[torch.arange(6), targets] = True  # some candidates masked, never a row's own positive
    w = torch.rand(3, 6, dtype=torch.float64, generator=g)
    ell = per_sample_infonce(q, c, allowed, targets, similarity, 2.0)
    eye = torch.eye(3, dtype=torch.float64)
    want = torch.autograd.grad(w @ ell, [q, c], grad_outputs=eye, is_grads_batched=True)
    got = infonce_cotangents(q.detach(), c.detach(), allowed, targets, w, similarity, 2.0)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
