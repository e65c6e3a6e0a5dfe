"""The hybrid-teacher distillation loss: hand-computed values, and zero loss and gradient when teacher == student."""

from __future__ import annotations

import math

import pytest
import torch

from hf_cocodr.data.teacher import teacher_rows
from hf_cocodr.finetuning.losses.distill import HybridDistillLoss
from hf_cocodr.retrieval.fusion import FusionConfig


class _NoModel(torch.nn.Module):
    similarity_fn_name = "dot"


def test_the_loss_equals_the_hand_computed_value():
    loss = HybridDistillLoss(_NoModel(), temperature=1.0, teacher_temperature=1.0, in_batch_weight=0.5)
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    c1 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    c2 = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    labels = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])  # teacher: uniform; then 3:1
    # student scores: [1, 0] for both queries
    p_student = [math.e / (math.e + 1), 1 / (math.e + 1)]
    kl_1 = sum(0.5 * math.log(0.5 / s) for s in p_student)
    kl_2 = 0.75 * math.log(0.75 / p_student[0]) + 0.25 * math.log(0.25 / p_student[1])
    # in-batch: query i against the first candidates of both rows, scores = identity
    nce = -math.log(math.e / (math.e + 1))
    expected = (kl_1 + kl_2) / 2 + 0.5 * nce
    got = loss.compute_loss_from_embeddings([q, c1, c2], labels)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_a_low_student_temperature_does_not_shrink_the_kl_term():
    """At the scale a cosine student was trained with (T_s below 1) the KL is the plain KL of the two softmaxes,
    hand-computed here at T_s = 0.5: not multiplied by T_s² (0.25), which would let the in-batch term train alone."""
    loss = HybridDistillLoss(_NoModel(), temperature=0.5, teacher_temperature=1.0, in_batch_weight=0.0)
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    c1 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    c2 = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    labels = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    p_student = [math.e**2 / (math.e**2 + 1), 1 / (math.e**2 + 1)]  # scores [1, 0] / 0.5
    kl_1 = sum(0.5 * math.log(0.5 / s) for s in p_student)
    kl_2 = 0.75 * math.log(0.75 / p_student[0]) + 0.25 * math.log(0.25 / p_student[1])
    got = loss.compute_loss_from_embeddings([q, c1, c2], labels)
    assert got.item() == pytest.approx((kl_1 + kl_2) / 2, rel=1e-6)


def test_bad_settings_are_refused():
    for kwargs in ({"temperature": 0}, {"teacher_temperature": -1.0}, {"in_batch_weight": -0.1}, {"similarity": "l2"}):
        with pytest.raises(ValueError):
            HybridDistillLoss(_NoModel(), **kwargs)


def _batch(model, rows):
    cols = ["query"] + [c for c in rows.column_names if c.startswith("doc_")]
    feats = [model.tokenize(rows[c]) for c in cols]
    return feats, torch.tensor(rows["label"])


def test_a_teacher_whose_scores_are_the_students_own_gives_zero_loss_and_gradient(tiny_st_dir, tiny_beir):
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.data.beir import load_beir
    from hf_cocodr.retrieval.hybrid import HybridRetriever

    model = SentenceTransformer(str(tiny_st_dir), device="cpu")
    model.eval()  # no dropout: the student's scores are the ones the teacher indexed
    data = load_beir(tiny_beir, "dev")
    queries = list(data.queries["text"])[:8]
    temp = 0.5

    own = HybridRetriever.build(model, data.corpus, fusion=FusionConfig(dense_weight=1.0, normalize=False))
    rows = teacher_rows(own, queries, _doc_texts(data.corpus), k=4)
    assert len(rows) == len(queries) and len(rows[0]["label"]) == 4
    loss = HybridDistillLoss(model, temperature=temp, teacher_temperature=temp, in_batch_weight=0.0)
    feats, labels = _batch(model, rows)
    value = loss(feats, labels)
    value.backward()
    assert abs(value.item()) < 1e-6
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and max(g.abs().max().item() for g in grads) < 1e-5

    # with BM25 in the teacher the student is pulled somewhere: a positive loss and a non-zero gradient
    model.zero_grad()
    hybrid = HybridRetriever.build(model, data.corpus, fusion=FusionConfig(dense_weight=0.5))
    rows = teacher_rows(hybrid, queries, _doc_texts(data.corpus), k=4)
    feats, labels = _batch(model, rows)
    value = loss(feats, labels)
    value.backward()
    assert value.item() > 1e-3
    assert max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None) > 1e-6


def _doc_texts(corpus) -> dict[str, str]:
    from hf_cocodr.data.beir import corpus_texts

    return {i: t for ids, texts in corpus_texts(corpus) for i, t in zip(ids, texts, strict=True)}


def test_without_document_gradients_the_value_is_the_same_and_only_the_queries_side_trains(tiny_st_dir, tiny_beir):
    """document_gradients=False equals the full loss with the candidates' embeddings detached: same value, same
    gradient as that hand-built graph, and a different gradient from the full loss (the candidates' side is gone)."""
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.data.beir import load_beir
    from hf_cocodr.retrieval.hybrid import HybridRetriever

    model = SentenceTransformer(str(tiny_st_dir), device="cpu")
    model.eval()  # no dropout: the three passes see the same embeddings
    data = load_beir(tiny_beir, "dev")
    queries = list(data.queries["text"])[:8]
    hybrid = HybridRetriever.build(model, data.corpus, fusion=FusionConfig(dense_weight=0.5))
    feats, labels = _batch(model, teacher_rows(hybrid, queries, _doc_texts(data.corpus), k=3))
    options = dict(temperature=0.5, teacher_temperature=1.0, in_batch_weight=1.0)

    def grads(value) -> list[torch.Tensor]:
        model.zero_grad()
        value.backward()
        return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]

    full = HybridDistillLoss(model, **options)
    queries_only = HybridDistillLoss(model, document_gradients=False, **options)
    v_full, v_q = full(feats, labels), queries_only(feats, labels)
    assert v_q.item() == pytest.approx(v_full.item(), rel=1e-6)
    g_full, g_q = grads(v_full), grads(v_q)
    embeddings = [model(feats[0])["sentence_embedding"]] + [model(f)["sentence_embedding"].detach() for f in feats[1:]]
    g_detached = grads(full.compute_loss_from_embeddings(embeddings, labels))
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(g_q, g_detached, strict=True))
    assert max((a - b).abs().max().item() for a, b in zip(g_q, g_full, strict=True)) > 1e-6
    assert queries_only.get_config_dict()["document_gradients"] is False
    with pytest.raises(ValueError, match="document_gradients"):
        HybridDistillLoss(model, document_gradients="no")
