"""One length-ordered forward for every text of a step: the cut that pads the fewest tokens (hand-computed and by
brute force), and the same embeddings, losses and gradients as one forward per column for MNRL, iDRO and
distillation rows."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from helpers import batch, features_for

from hf_cocodr.finetuning.losses import IDROLoss
from hf_cocodr.finetuning.losses.distill import HybridDistillLoss
from hf_cocodr.modeling.packing import PackedColumns, embed_packed, length_groups, pack_columns, task_blind


def padded_tokens(lengths, ends) -> int:
    ordered, begin, total = np.sort(lengths), 0, 0
    for end in ends:
        total += (end - begin) * int(ordered[end - 1])
        begin = end
    return total


def test_length_groups_hand_computed():
    lengths = [100, 5, 12, 5, 100, 5]  # sorted: 5 5 5 12 100 100
    assert length_groups(lengths, 1) == [6]  # 6 x 100 = 600 tokens
    assert length_groups(lengths, 2) == [4, 6]  # 4 x 12 + 2 x 100 = 248 (not 3 x 5 + 3 x 100 = 315)
    assert length_groups(lengths, 3) == [3, 4, 6]  # 15 + 12 + 200 = 227
    assert length_groups(lengths, 9) == [3, 4, 6]  # never more groups than distinct lengths
    assert length_groups([7, 7, 7, 7], 3) == [4]  # equal lengths: one group
    assert length_groups([], 3) == []


def test_length_groups_pad_the_fewest_tokens():
    rng = np.random.default_rng(0)
    for _ in range(200):
        lengths = rng.integers(1, 40, size=int(rng.integers(1, 12)))
        groups = int(rng.integers(1, 5))
        ordered = np.sort(lengths)
        bounds = [int((ordered <= v).sum()) for v in np.unique(ordered)]  # cuts between distinct lengths
        best = min(
            padded_tokens(lengths, [*cut, len(lengths)])
            for k in range(groups)
            for cut in itertools.combinations(bounds[:-1], k)
        )
        ends = length_groups(lengths, groups)
        assert len(ends) <= groups and ends[-1] == len(lengths)
        assert padded_tokens(lengths, ends) == best


@pytest.fixture()
def model(tiny_st_dir):
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    # no dropout: both paths see the same network. In float64: the paths pad to other widths, so they sum in other
    # orders, and the losses' gradients are small differences of softmax probabilities computed from large scores;
    # in float32 that turns rounding into differences of up to 0.6% of a gradient's scale (the [CLS] row of the word
    # embeddings), varying from process to process with the kernels' memory layout; in float64 they are about 1e-12
    # of it, so the comparisons below can be strict.
    return SentenceTransformer(str(tiny_st_dir)).double().eval()


def packed_features(model, columns, max_groups=4):
    feats = PackedColumns(features_for(model, columns))
    feats.packed = pack_columns(feats, max_groups)
    return feats


def grads_of(model, value):
    model.zero_grad()
    value.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(a, b):
    assert a.keys() == b.keys() and len(a) > 10
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-8, atol=1e-14, msg=n)


def test_packed_embeddings_equal_one_forward_per_column(model):
    cols = batch(8)  # short queries, longer documents
    feats = features_for(model, cols)
    packed = pack_columns(feats, 4)
    widths = [g["input_ids"].shape[1] for g in packed.groups]
    assert len(widths) > 1 and max(widths) == max(f["input_ids"].shape[1] for f in feats)
    assert sum(g["input_ids"].shape[0] for g in packed.groups) == 24 and widths == sorted(widths)
    with torch.no_grad():
        got = embed_packed(model, feats, packed=packed)
        want = [model(f)["sentence_embedding"] for f in features_for(model, cols)]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_left_padded_rows_stay_in_one_full_width_group(model):
    feats = features_for(model, batch(4))
    for f in feats:  # move every row's tokens to the end
        n = f["attention_mask"].sum(1)
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            f[key] = torch.stack([torch.roll(row, int(f[key].shape[1] - k)) for row, k in zip(f[key], n)])
    packed = pack_columns(feats, 4)
    assert len(packed.groups) == 1 and packed.groups[0]["input_ids"].shape[1] == max(
        f["input_ids"].shape[1] for f in feats
    )


def test_mnrl_rows_one_forward_equals_per_column(model):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    cols = batch(8, seed=2)
    mnrl = MultipleNegativesRankingLoss(model)
    packed = grads_of(
        model, mnrl.compute_loss_from_embeddings(embed_packed(model, packed_features(model, cols)), None)
    )
    per_column = [model(f)["sentence_embedding"] for f in features_for(model, cols)]
    assert_same_grads(packed, grads_of(model, mnrl.compute_loss_from_embeddings(per_column, None)))


@pytest.mark.parametrize("preset", ["paper", "reference"])
def test_idro_rows_one_forward_equals_per_column(model, preset):
    """Loss, gradients, the gradient Gram (the pooled-position probe reads the rows in the groups' order) and the
    updated weights."""
    cols = batch(10, seed=1)
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 2, 2, 4, 1])
    runs = []
    for feats in (packed_features(model, cols), features_for(model, cols)):
        loss = IDROLoss(model, preset=preset, num_clusters=5, grad_params="auto")
        value = loss(feats, labels)
        runs.append((value.detach(), grads_of(model, value), loss.last_stats["grad_gram"], loss.weights))
    (v1, g1, gram1, w1), (v2, g2, gram2, w2) = runs
    torch.testing.assert_close(v1, v2, rtol=1e-10, atol=1e-12)
    assert_same_grads(g1, g2)
    torch.testing.assert_close(gram1, gram2, rtol=1e-8, atol=1e-18)
    torch.testing.assert_close(w1, w2, rtol=1e-10, atol=1e-12)


def test_distillation_rows_one_forward_equals_per_column(model):
    cols = batch(6, seed=3) + batch(6, seed=4)[1:]  # a query and four candidates
    labels = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    loss = HybridDistillLoss(model, temperature=0.5, in_batch_weight=0.5, similarity="dot")
    packed = grads_of(model, loss(packed_features(model, cols), labels))
    per_column = [model(f)["sentence_embedding"] for f in features_for(model, cols)]
    assert_same_grads(packed, grads_of(model, loss.compute_loss_from_embeddings(per_column, labels)))


def test_length_grouping_changes_no_loss_value(model):
    cols = batch(8, seed=5)
    labels = torch.tensor([0, 1, 1, 2, 0, 2, 1, 0])
    values = []
    for groups in (1, 2, 4):
        feats = packed_features(model, cols, max_groups=groups)
        assert len(feats.packed.groups) == (1 if groups == 1 else len(feats.packed.groups)) <= groups
        assert groups < 4 or len(feats.packed.groups) > 1
        with torch.no_grad():
            values.append(float(IDROLoss(model, preset="paper", num_clusters=3)(feats, labels)))
    assert values == pytest.approx([values[0]] * 3, rel=1e-6)


def test_query_and_document_stamps_share_a_forward_only_for_a_task_blind_model(model):
    """The trainers' collator stamps each column with its task (query, document): a model without a Router embeds
    them alike, so the stamps are left out of the groups; kept, they keep the columns apart (no plan)."""
    cols = batch(4, seed=6)
    feats = [{**model.preprocess(cols[0], task="query"), "task": "query"}]  # as the collator stamps them
    feats += [{**model.preprocess(c, task="document"), "task": "document"} for c in cols[1:]]
    assert task_blind(model)
    assert pack_columns(feats) is None
    packed = pack_columns(feats, ignore_keys=("task",))
    assert packed is not None and all("task" not in g for g in packed.groups)
    with torch.no_grad():
        got = embed_packed(model, feats, packed=packed)
        want = [model(f)["sentence_embedding"] for f in feats]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_the_trainers_hand_their_losses_a_plan(tiny_st_dir, tmp_path):
    from datasets import Dataset

    from hf_cocodr import DistillationTrainer, DistillationTrainingArguments, load_encoder

    cols = batch(8, seed=7)
    rows = Dataset.from_dict({"query": cols[0], "doc_1": cols[1], "doc_2": cols[2], "label": [[1.0, 0.0]] * 8})
    for packed in (True, False):
        args = DistillationTrainingArguments(
            output_dir=str(tmp_path / str(packed)),
            per_device_train_batch_size=4,
            max_steps=1,
            use_cpu=True,
            report_to="none",
            packed_forward=packed,
        )
        trainer = DistillationTrainer(model=load_encoder(str(tiny_st_dir)), args=args, train_dataset=rows)
        features = trainer.materialize(torch.tensor([0, 3, 5, 6]))[0]
        assert isinstance(features, PackedColumns) and len(features) == 3
        assert (features.packed is not None) == packed
        if packed:
            assert sum(g["input_ids"].shape[0] for g in features.packed.groups) == 12
