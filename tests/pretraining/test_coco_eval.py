"""Evaluation during COCO pretraining: held-out corpora in every form of ``corpora=``, eval contrastive and MLM
losses on the same spans each time, no state changed by evaluating, and ``pretrain --eval-corpus``."""

from __future__ import annotations

import copy
import json
import random

import datasets
import pytest
import torch

from hf_cocodr import CocoPretrainer, CocoPretrainingArguments
from hf_cocodr.cli import main

KEYS = ("eval_loss", "eval_contrastive_loss", "eval_mlm_loss", "eval_head_mlm_loss")


def coco_args(out, **kw):
    base = dict(
        output_dir=str(out),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=4,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=11,
        disable_tqdm=True,
    )
    base.update(kw)
    return CocoPretrainingArguments(**base)


def held_out_texts(n: int = 8) -> list[str]:
    import tiny

    rng = random.Random(21)
    return [tiny.document(rng, sorted(tiny.TOPICS)[i % 8], 4) for i in range(n)]


@pytest.fixture(scope="module")
def held_out_jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("held_out") / "docs.jsonl"
    path.write_text(
        "".join(json.dumps({"title": f"doc {i}", "text": t}) + "\n" for i, t in enumerate(held_out_texts()))
    )
    return path


@pytest.fixture(scope="module")
def held_out_beir(tmp_path_factory):
    import tiny

    return tiny.make_beir(tmp_path_factory.mktemp("held_out_beir") / "dev", n_docs=8, seed=4)


def test_eval_losses_during_training_and_for_every_corpus_form(
    tiny_bert_dir, tiny_beir, held_out_beir, held_out_jsonl, tmp_path
):
    args = coco_args(tmp_path / "o", max_steps=2, eval_strategy="steps", eval_steps=1)
    trainer = CocoPretrainer(str(tiny_bert_dir), args, corpora=[tiny_beir], eval_dataset=held_out_beir)
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert [h["step"] for h in evals] == [1, 2]
    a = trainer.args
    for h in evals:
        assert all(k in h for k in KEYS), h
        assert h["eval_contrastive_loss"] > 0 and h["eval_mlm_loss"] > 0 and h["eval_head_mlm_loss"] > 0
        weighted = (
            a.mlm_weight * h["eval_mlm_loss"]
            + a.head_mlm_weight * h["eval_head_mlm_loss"]
            + a.contrastive_weight * h["eval_contrastive_loss"]
        )
        assert h["eval_loss"] == pytest.approx(weighted, rel=1e-4)
    # the training log keeps its own components
    assert any("contrastive_loss" in h and "eval_loss" not in h for h in trainer.state.log_history)

    ds = datasets.Dataset.from_dict({"text": held_out_texts()})
    for form in (str(held_out_jsonl), ds, [held_out_jsonl, ds]):
        metrics = trainer.evaluate(eval_dataset=form)
        assert all(k in metrics for k in KEYS), (form, metrics)
    # an explicit set is for that call only: the trainer's own eval set is back
    assert trainer.evaluate()["eval_loss"] == pytest.approx(evals[-1]["eval_loss"], rel=1e-6)


def test_evaluate_twice_changes_nothing(tiny_bert_dir, tiny_beir, held_out_jsonl, tmp_path):
    args = coco_args(tmp_path / "o", max_steps=2, eval_strategy="steps", eval_steps=2)
    trainer = CocoPretrainer(str(tiny_bert_dir), args, corpora=[tiny_beir], eval_dataset=str(held_out_jsonl))
    trainer.train()
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    optimizer = copy.deepcopy(trainer.optimizer.state_dict())
    assert optimizer["state"]
    rng = torch.get_rng_state()
    first = trainer.evaluate()
    second = trainer.evaluate()
    for k in KEYS:  # the same spans and masks each time
        assert first[k] == second[k], k
    for n, p in trainer.model.named_parameters():
        assert torch.equal(p, params[n]), n
    now = trainer.optimizer.state_dict()
    for k, st in optimizer["state"].items():
        for name, v in st.items():
            assert torch.equal(v, now["state"][k][name]) if isinstance(v, torch.Tensor) else v == now["state"][k][name]
    assert torch.equal(torch.get_rng_state(), rng)  # the steps after an evaluation draw what they would have


def test_cli_eval_corpus(tiny_bert_dir, tiny_beir, held_out_jsonl, tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(
        [
            "pretrain",
            "--model",
            str(tiny_bert_dir),
            "--corpus",
            str(tiny_beir),
            "--eval-corpus",
            str(held_out_jsonl),
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--eval_steps",
            "1",
            "--per_device_train_batch_size",
            "8",
            "--save_strategy",
            "no",
            "--use_cpu",
            "--disable_tqdm",
            "true",
        ]
    )
    assert rc == 0
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    evals = [h for h in history if "eval_contrastive_loss" in h]
    assert [h["step"] for h in evals] == [1, 2]
    assert all("eval_mlm_loss" in h for h in evals)


def test_cli_eval_corpus_missing_is_one_line(tiny_bert_dir, tiny_beir, tmp_path, capsys, monkeypatch):
    from hf_cocodr.modeling import condenser

    def no_loading(*a, **k):
        raise AssertionError("a model was loaded before --eval-corpus was checked")

    monkeypatch.setattr(condenser.CondenserForPretraining, "from_pretrained", no_loading)
    rc = main(
        [
            "pretrain",
            "--model",
            str(tiny_bert_dir),
            "--corpus",
            str(tiny_beir),
            "--eval-corpus",
            str(tmp_path / "missing.jsonl"),
            "--output_dir",
            str(tmp_path / "o"),
            "--use_cpu",
        ]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert f"--eval-corpus {tmp_path / 'missing.jsonl'}: no such file or folder" in lines[-1], lines
    assert not any("Traceback" in line for line in lines)
