from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from tiny import stop_at

from hf_cocodr import IDROTrainer, IDROTrainingArguments, RetrievalTrainingData, load_encoder
from hf_cocodr.methods import (
    BERMObjective,
    GroupedBatchSampler,
    MoDIRObjective,
    balance_loss,
    configure_methods,
    confusion_loss,
    extraction_loss,
)


def args_for(out, **kw):
    base = dict(
        output_dir=str(out),
        per_device_train_batch_size=8,
        max_steps=3,
        num_clusters=3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=5,
        learning_rate=1e-3,
        idro_tau=50.0,
        dataloader_drop_last=True,
    )
    base.update(kw)
    return IDROTrainingArguments(**base)


def train_with(methods, tiny_st_dir, tiny_beir, tmp_path, out="o", callbacks=(), resume=None, queries=(), **kw):
    torch.manual_seed(0)
    model = load_encoder(str(tiny_st_dir))
    args = args_for(tmp_path / out, **kw)
    data = RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="bm25")
    loss, data, setup = configure_methods(methods, model, args, data, None, [str(tiny_beir)], target_queries=queries)
    trainer = IDROTrainer(model=model, args=args, train_dataset=data, loss=loss, callbacks=list(callbacks))
    setup(trainer)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer.train(resume_from_checkpoint=resume)
    changed = {n: not torch.equal(before[n], p.detach()) for n, p in model.named_parameters() if p.requires_grad}
    return trainer, changed


# ------------------------------------------------------------------------------------------------ MoDIR
def test_confusion_loss_is_minimal_at_50_50():
    assert float(confusion_loss(torch.zeros(4, 2))) == pytest.approx(math.log(2))
    for logits in (torch.tensor([[2.0, -1.0]]), torch.tensor([[0.3, 0.0], [-5.0, 1.0]])):
        assert float(confusion_loss(logits)) > math.log(2)


def test_modir_trains_logs_and_checkpoints(tiny_st_dir, tiny_beir, tmp_path):
    trainer, changed = train_with(["modir"], tiny_st_dir, tiny_beir, tmp_path)
    assert all(v for n, v in changed.items() if "pooler" not in n), [n for n, v in changed.items() if not v]
    logged = [h for h in trainer.state.log_history if "loss" in h]
    for key in ("domain_classifier_accuracy", "confusion_loss", "modir_loss", "retrieval_loss"):
        assert key in logged[0], key
    modir = trainer.idro_loss.auxiliary[0]
    assert len(modir.queue) == 3  # one entry per step
    tensors = modir.state_tensors()
    fresh = MoDIRObjective(["x"], modir.classifier.shape[1], queue_batches=10)
    fresh.load_state_tensors(tensors)
    torch.testing.assert_close(fresh.classifier, modir.classifier)
    assert [len(d) for _, d in fresh.queue] == [len(d) for _, d in modir.queue]
    for (a, _), (b, _) in zip(fresh.queue, modir.queue):
        torch.testing.assert_close(a, b)


def test_modir_queue_is_bounded():
    m = MoDIRObjective(["target text"], 4, queue_batches=2)
    for _ in range(5):
        m.queue.append((torch.zeros(3, 4), torch.zeros(3, dtype=torch.long)))
        del m.queue[: max(0, len(m.queue) - m.queue_batches)]
    assert len(m.queue) == 2
    assert m.lam(0) == 1.0 and m.lam(10_000) == pytest.approx(0.5)


def test_modir_needs_a_target_stream(tiny_st_dir, tiny_beir, tmp_path):
    model = load_encoder(str(tiny_st_dir))
    data = RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="none")
    with pytest.raises(ValueError, match="need\\(s\\) a target stream"):
        configure_methods(["modir"], model, args_for(tmp_path), data, None, [])
    with pytest.raises(ValueError, match="stream of unlabelled target texts"):
        MoDIRObjective(["  ", ""], 8)


# ------------------------------------------------------------------------------------------------ BERM
def test_berm_losses_hand_checkable():
    assert float(balance_loss(torch.full((5,), 0.7))) == pytest.approx(0.0, abs=1e-7)
    assert float(balance_loss(torch.tensor([2.0, 0.0]))) > 0
    units = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    m = torch.tensor([2.0, 0.0])
    expected = -math.log(math.exp(2) / (math.exp(2) + 1))
    assert float(extraction_loss(m, units, 0)) == pytest.approx(expected, abs=1e-6)


def test_berm_units_follow_the_encoded_tokens(tiny_st_dir, tiny_beir):
    model = load_encoder(str(tiny_st_dir))
    berm = BERMObjective(model.tokenizer, ["cardiac artery", "piano melody"])
    text = "Cardiac artery pressure rises. The pulse is fast. Statin therapy helps."
    ids = model.tokenizer(text, return_tensors="pt")["input_ids"][0]
    spans = berm.unit_token_spans(text, ids)
    assert len(spans) == 3 and spans[0][0] == 1 and spans[-1][1] == len(ids) - 1  # [CLS] ... [SEP]
    short = model.tokenizer(text, truncation=True, max_length=8, return_tensors="pt")["input_ids"][0]
    berm_short = BERMObjective(model.tokenizer, ["x"], max_length=8)
    assert len(berm_short.unit_token_spans(text, short)) == 1  # truncation dropped the later units
    # the essential unit is the one BM25 prefers
    scores = berm.bm25.scores("piano melody", ["cardiac artery pressure", "a piano melody plays"])
    assert int(np.argmax(scores)) == 1


def test_berm_trains_and_handles_single_unit_passages(tiny_st_dir, tiny_beir, tmp_path):
    trainer, changed = train_with(["berm"], tiny_st_dir, tiny_beir, tmp_path)
    assert all(v for n, v in changed.items() if "pooler" not in n)
    logged = [h for h in trainer.state.log_history if "loss" in h][0]
    assert "berm_extract_loss" in logged and "berm_balance_loss" in logged
    berm = trainer.idro_loss.auxiliary[0]
    q = torch.randn(1, 32)
    ids = berm.tokenizer(["one sentence only"], return_tensors="pt")["input_ids"]
    out = berm(
        q,
        q,
        {"token_embeddings": torch.randn(1, ids.shape[1], 32), "input_ids": ids},
        ["query"],
        ["one sentence only"],
    )
    assert float(out["berm_balance_loss"]) == 0.0 and berm.last_stats["single_unit_passages"] == 1


# ------------------------------------------------------------------------------------------------ RMSC
def test_grouped_batches_never_mix():
    groups = np.array([0] * 20 + [1] * 13 + [2] * 9)
    sampler = GroupedBatchSampler(groups, 4, seed=1)
    batches = list(sampler)
    assert batches and all(len(set(groups[b])) == 1 for b in batches)
    assert len({tuple(b) for b in batches}) == len(batches)
    sampler.set_epoch(1)
    assert list(sampler) != batches


def test_grouped_batches_line_up_across_ranks():
    """accelerate deals batch i to rank i mod world_size: each step's per-rank batches share one combination and
    together are the batch of a single process with the global batch size."""
    groups = np.array([0] * 37 + [1] * 21 + [2] * 16)
    single = list(GroupedBatchSampler(groups, 8, seed=3))
    two = list(GroupedBatchSampler(groups, 4, seed=3, world_size=2))
    rank0, rank1 = two[0::2], two[1::2]
    assert len(rank0) == len(rank1) == len(single)
    for a, b, s in zip(rank0, rank1, single):
        assert len(set(groups[a + b])) == 1
        assert a + b == s


def test_rmsc_trains_with_homogeneous_batches_and_exports_t_h(tiny_st_dir, tiny_beir, tmp_path):
    from sentence_transformers import SentenceTransformer

    seen = []
    orig = IDROTrainer.materialize

    def spy(self, rows):
        seen.append(self.training_data.combination(rows.cpu().numpy()))
        out = orig(self, rows)
        ids = out[0][0]["input_ids"]
        tok = self.model.tokenizer
        d, r = {"source_human": ("[S]", "[H]"), "source_weak": ("[S]", "[W]"), "target_weak": ("[T]", "[W]")}[seen[-1]]
        assert (ids[:, 1] == tok.convert_tokens_to_ids(d)).all()
        lengths = out[0][0]["attention_mask"].sum(1)
        assert (ids[torch.arange(len(ids)), lengths - 2] == tok.convert_tokens_to_ids(r)).all()
        return out

    IDROTrainer.materialize = spy
    try:
        trainer, changed = train_with(["rmsc"], tiny_st_dir, tiny_beir, tmp_path, max_steps=8)
    finally:
        IDROTrainer.materialize = orig
    assert set(seen) >= {"source_weak", "target_weak"}
    assert all(v for n, v in changed.items() if "pooler" not in n), [n for n, v in changed.items() if not v]
    trainer.finalize()
    model = SentenceTransformer(str(tmp_path / "o"))
    tok = model.tokenizer
    long_text = "cardiac artery " * 200  # far longer than the max length: the tokens must survive
    ids = tok(long_text, truncation=True, max_length=32)["input_ids"]
    assert (
        len(ids) == 32 and ids[1] == tok.convert_tokens_to_ids("[T]") and ids[-2] == tok.convert_tokens_to_ids("[H]")
    )
    # encode() alone gives the [T] ... [H] embedding
    feats = model.preprocess(["pulse and blood pressure"])
    assert feats["input_ids"][0, 1] == tok.convert_tokens_to_ids("[T]")
    card = json.loads((tmp_path / "o" / "hf_cocodr_provenance.json").read_text())
    assert "rmsc" in card["methods"]


def test_rmsc_rows_are_clustered_with_their_own_tokens_and_checkpoints_encode_t_h(tiny_st_dir, tiny_beir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.methods.rmsc import COMBINATIONS, set_rmsc_template
    from hf_cocodr.retrieval.encoding import encode_texts

    trainer, _ = train_with(
        ["rmsc"], tiny_st_dir, tiny_beir, tmp_path, max_steps=2, save_strategy="steps", save_steps=1
    )
    data = trainer.training_data
    start = data.offsets[2]  # the first target-weak row
    lo, hi = start - 2, start + 2  # two source-weak rows, two target-weak rows
    got = trainer.encode_query_rows(lo, hi)
    texts = data.query_texts
    set_rmsc_template(trainer.model, *COMBINATIONS["source_weak"])
    sw = encode_texts(trainer.model, texts[lo:start], kind="query")
    set_rmsc_template(trainer.model, *COMBINATIONS["target_weak"])
    tw = encode_texts(trainer.model, texts[start:hi], kind="query")
    np.testing.assert_allclose(got, np.concatenate([sw, tw]), rtol=1e-5, atol=1e-6)
    set_rmsc_template(trainer.model, *COMBINATIONS["source_human"])
    # precondition: the tokens change the embeddings by more than the tolerance used above, so that check could
    # tell the combinations apart (the tiny model maps texts to nearly one vector: a fixed 1e-4 failed in full runs)
    assert not np.allclose(got[2:], encode_texts(trainer.model, texts[start:hi], kind="query"), rtol=1e-5, atol=1e-6)
    # a checkpoint loaded as a model adds [T] ... [H] by itself, like the final model
    tok = SentenceTransformer(str(tmp_path / "o" / "checkpoint-1")).tokenizer
    ids = tok("pulse and blood pressure")["input_ids"]
    assert ids[1] == tok.convert_tokens_to_ids("[T]") and ids[-2] == tok.convert_tokens_to_ids("[H]")


def test_combination_cli_coco_then_idro_berm(tiny_bert_dir, tiny_beir, tmp_path, capsys):
    from hf_cocodr.cli import main

    common = ["--max_steps", "2", "--per_device_train_batch_size", "8", "--use_cpu"]
    assert (
        main(
            [
                "pretrain",
                "--model",
                str(tiny_bert_dir),
                "--corpus",
                str(tiny_beir),
                "--output_dir",
                str(tmp_path / "coco"),
                *common,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "finetune",
                "--model",
                str(tmp_path / "coco"),
                "--train-data",
                str(tiny_beir),
                "--output_dir",
                str(tmp_path / "ft"),
                "--num-clusters",
                "2",
                "--method",
                "berm",
                "--method",
                "modir",
                "--target-corpus",
                str(tiny_beir),
                "--target-queries",
                str(tiny_beir),
                "--modir_lambda",
                "0.25",
                *common,
            ]
        )
        == 0
    )
    info = json.loads((tmp_path / "ft" / "hf_cocodr_provenance.json").read_text())
    assert {"coco", "idro", "berm", "modir"} <= set(info["methods"])
    card = (tmp_path / "ft" / "README.md").read_text()
    assert "xu2023berm" in card and "xin2022modir" in card
    assert "λ₀=0.25" in card and "MoDIR also read the **queries**" in card


@pytest.mark.parametrize(
    "bad",
    [
        dict(modir_queue_batches=0),
        dict(modir_classifier_lr=0.0),
        dict(berm_alpha=-1.0),
        dict(rmsc_weak_mode="cloze"),
        dict(rmsc_k=0),
        dict(rmsc_weak_pairs=0),
    ],
)
def test_bad_method_settings_are_refused_by_name(bad, tmp_path):
    from hf_cocodr.errors import ConfigError

    with pytest.raises(ConfigError, match=next(iter(bad))):
        args_for(tmp_path, **bad)


# ------------------------------------------------------------------------------------------------ all methods
@pytest.mark.parametrize("method", ["modir", "berm", "rmsc"])
def test_resumed_run_equals_uninterrupted(method, tiny_st_dir, tiny_beir, tmp_path):
    """Stop at step 3 (checkpoint), resume to step 6: same losses, parameters and method state as one run."""
    kw = dict(max_steps=6, save_strategy="steps", save_steps=3)
    full, _ = train_with([method], tiny_st_dir, tiny_beir, tmp_path, out="full", **kw)
    part, _ = train_with([method], tiny_st_dir, tiny_beir, tmp_path, out="part", callbacks=[stop_at(3)], **kw)
    assert part.state.global_step == 3
    resumed, _ = train_with([method], tiny_st_dir, tiny_beir, tmp_path, out="part", resume=True, **kw)
    assert resumed.state.global_step == 6

    def later(trainer, key):
        return [h[key] for h in trainer.state.log_history if key in h and h["step"] > 3]

    for key in (
        "loss",
        *{
            "modir": ["confusion_loss", "domain_classifier_accuracy"],
            "berm": ["berm_extract_loss", "berm_balance_loss"],
            "rmsc": [],
        }[method],
    ):
        assert later(resumed, key) == pytest.approx(later(full, key), rel=1e-5), key
    for (n, a), b in zip(full.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)
    if method == "modir":
        a, b = full.idro_loss.auxiliary[0], resumed.idro_loss.auxiliary[0]
        torch.testing.assert_close(a.classifier, b.classifier, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(a.adam_v, b.adam_v, rtol=1e-5, atol=1e-12)
        assert a.adam_t == b.adam_t == 6 and len(a.queue) == len(b.queue) == 6


def test_method_settings_reach_the_objectives_and_the_card(tiny_st_dir, tiny_beir, tmp_path):
    trainer, _ = train_with(
        ["modir", "berm"],
        tiny_st_dir,
        tiny_beir,
        tmp_path,
        max_steps=1,
        modir_lambda=0.5,
        queries=[str(tiny_beir)],
        modir_half_life=100.0,
        modir_queue_batches=7,
        modir_classifier_lr=0.05,
        berm_alpha=0.2,
        berm_beta=0.0,
    )
    modir, berm = trainer.idro_loss.auxiliary
    assert (modir.lambda0, modir.half_life, modir.queue_batches, modir.classifier_lr) == (0.5, 100.0, 7, 0.05)
    assert (berm.alpha, berm.beta) == (0.2, 0.0)
    logged = [h for h in trainer.state.log_history if "loss" in h][0]
    assert logged["berm_balance_loss"] == 0.0  # beta = 0 switches the term off
    trainer.finalize()
    card = (tmp_path / "o" / "README.md").read_text()
    assert "λ₀=0.5" in card and "α=0.2" in card
    # MoDIR read the target documents during fine-tuning: the zero-shot disclosure says so
    assert "During fine-tuning, MoDIR read the **documents** of: " + tiny_beir.name in card
    assert "No target corpus was read" not in card
    # ... and the target queries it was given (half of each step's target sample: 4 queries + 4 documents)
    assert "MoDIR also read the **queries** (never their relevance labels) of: " + tiny_beir.name in card
    assert "It never saw the relevance labels" in card and "never saw the queries" not in card
    assert modir.target_queries and [len(d) for _, d in modir.queue] == [8 + 8 + 8]


def test_target_queries_need_modir_and_must_exist(tiny_st_dir, tiny_beir, tmp_path):
    from hf_cocodr.errors import ConfigError

    model = load_encoder(str(tiny_st_dir))
    data = RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="none")
    with pytest.raises(ConfigError, match="only read by MoDIR"):
        configure_methods(
            ["berm"], model, args_for(tmp_path), data, None, [str(tiny_beir)], target_queries=[str(tiny_beir)]
        )
    with pytest.raises(ConfigError, match="no such BEIR folder or JSONL file"):
        configure_methods(
            ["modir"],
            model,
            args_for(tmp_path),
            data,
            None,
            [str(tiny_beir)],
            target_queries=[str(tmp_path / "missing")],
        )


def test_modir_classifier_learns_a_separable_queue_and_then_drives_the_confusion_loss():
    """Adam on the queue: a separable queue is classified within a few steps whatever the embedding scale, and the
    frozen classifier's confusion loss then has a gradient that moves embeddings towards the boundary."""
    g = torch.Generator().manual_seed(0)
    direction = torch.nn.functional.normalize(torch.randn(16, generator=g), dim=0)
    for scale in (1.0, 20.0):
        m = MoDIRObjective(["t"], 16, queue_batches=4, classifier_lr=0.05)
        src = torch.nn.functional.normalize(torch.randn(32, 16, generator=g) + 2 * direction, dim=1) * scale
        tgt = torch.nn.functional.normalize(torch.randn(32, 16, generator=g) - 2 * direction, dim=1) * scale
        m.queue.append((torch.cat([src, tgt]), torch.cat([torch.zeros(32), torch.ones(32)]).long()))
        for _ in range(10):
            m._train_classifier()
        assert m.last_accuracy > 0.95, scale
        emb = torch.cat([src, tgt]).requires_grad_(True)
        conf = confusion_loss(emb @ m.classifier.T)
        assert float(conf.detach()) > math.log(2) + 1e-3  # a confident classifier: the encoder is pushed
        (grad,) = torch.autograd.grad(conf, emb)
        # descending the confusion loss moves source embeddings against the source side, target ones towards it
        side = m.classifier[1] - m.classifier[0]  # > 0 along the target direction
        assert float((-grad[:32] @ side).mean()) > 0 and float((-grad[32:] @ side).mean()) < 0
