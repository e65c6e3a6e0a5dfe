"""The joint target pseudo-pair term: weight zero is plain iDRO, the term is the InfoNCE of the sampled pairs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_cocodr.data.pseudo_pairs import target_pseudo_pairs


def _joint_run(tiny_st_dir, tiny_beir, tmp_path, name, weight=None, steps=2):
    from hf_cocodr import IDROTrainer, IDROTrainingArguments, RetrievalTrainingData, load_encoder
    from hf_cocodr.methods.joint import JointPseudoPairs, TargetPairsObjective

    torch.manual_seed(0)
    model = load_encoder(str(tiny_st_dir))
    for m in model.modules():  # no dropout: the extra forward of the joint term must not shift any RNG stream
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    args = IDROTrainingArguments(
        output_dir=str(tmp_path / name),
        per_device_train_batch_size=8,
        max_steps=steps,
        num_clusters=3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=5,
        learning_rate=1e-3,
        dataloader_drop_last=True,
        num_negatives=1,
    )
    data = RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="bm25")
    joint = []
    if weight is not None:
        pairs = target_pseudo_pairs([tiny_beir], "title_body", seed=1, bm25_top_k=5)
        objective = TargetPairsObjective(pairs, weight, batch_size=6, similarity="dot", scale=1.0, seed=1)
        joint = [JointPseudoPairs(objective)]
    trainer = IDROTrainer(model=model, args=args, train_dataset=data, methods=joint)
    trainer.train()
    return trainer, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_joint_with_target_weight_zero_is_plain_idro(tiny_st_dir, tiny_beir, tmp_path):
    _, plain = _joint_run(tiny_st_dir, tiny_beir, tmp_path, "plain")
    tr, zero = _joint_run(tiny_st_dir, tiny_beir, tmp_path, "zero", weight=0.0)
    assert all(torch.equal(plain[k], zero[k]) for k in plain)
    assert not any("target_pairs_loss" in h for h in tr.state.log_history)
    tr1, one = _joint_run(tiny_st_dir, tiny_beir, tmp_path, "one", weight=1.0)
    assert any(not torch.equal(plain[k], one[k]) for k in plain)
    assert any("target_pairs_loss" in h for h in tr1.state.log_history)


def test_joint_term_is_the_infonce_of_the_sampled_pairs(tiny_st_dir, tiny_beir):
    """The term equals a hand-written InfoNCE over the same pairs (dot product, in-batch + hard negatives), scaled
    by its weight; with the source loss weighted 0 it would be the whole gradient."""
    from hf_cocodr import load_encoder
    from hf_cocodr.methods.joint import TargetPairsObjective

    model = load_encoder(str(tiny_st_dir)).eval()
    pairs = target_pseudo_pairs([tiny_beir], "title_body", seed=1, bm25_top_k=5)
    obj = TargetPairsObjective(pairs, 0.5, batch_size=4, similarity="dot", scale=1.0, seed=1)
    rows = obj.sample_rows(3, 4)
    assert len(set(rows.tolist())) == 4 and np.array_equal(rows, obj.sample_rows(3, 4))
    with torch.no_grad():
        term = obj.compute(model, [torch.zeros(4, 2)], None, {"step": 3})["target_pairs_loss"]
        cols, _, _ = pairs.sample(rows, step=3, seed=1, num_negatives=1)
        q = torch.as_tensor(model.encode_query(cols[0]))
        d = torch.as_tensor(np.concatenate([model.encode_document(cols[1]), model.encode_document(cols[2])]))
        s = q @ d.T
        by_hand = -(s.diagonal() - torch.logsumexp(s, dim=1)).mean()
    assert float(term) == pytest.approx(0.5 * float(by_hand), rel=1e-4)
