"""The method interface: methods plug into IDROTrainer through hooks only, and own their settings."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from hf_cocodr import IDROTrainer, IDROTrainingArguments, RetrievalTrainingData, load_encoder
from hf_cocodr.methods import (
    BUILTIN,
    METHODS,
    Method,
    configure_methods,
    get_method,
    register_method,
    registered_methods,
    unregister_method,
    validate_methods,
)

TRAINER_SOURCE = Path(__file__).resolve().parents[2] / "hf_cocodr" / "finetuning" / "trainer.py"


def test_the_trainer_names_no_method():
    """IDROTrainer knows methods only through the hooks: its module names none of them."""
    names = sorted({*METHODS, "rmsc", "modir", "berm"})
    pattern = re.compile("|".join(names), re.IGNORECASE)
    hits = [
        f"{i}: {line.strip()}"
        for i, line in enumerate(TRAINER_SOURCE.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, "hf_cocodr/finetuning/trainer.py names a method:\n" + "\n".join(hits)


def test_registry_lists_the_builtin_methods_and_each_owns_its_settings():
    assert METHODS == ("modir", "berm", "rmsc")
    assert [cls.name for cls in BUILTIN] == list(METHODS) and list(registered_methods())[:3] == list(METHODS)
    args_fields = {f.name: f for f in dataclasses.fields(IDROTrainingArguments)}
    for cls in BUILTIN:
        assert get_method(cls.name.upper()) is cls and issubclass(cls, Method)
        assert cls.citation and cls.citation["bibtex"].startswith("@")
        for f in dataclasses.fields(cls.settings):  # every setting is a training argument, with its help text
            assert f.name.startswith(f"{cls.name}_"), f.name
            assert args_fields[f.name].default == f.default and args_fields[f.name].metadata == f.metadata
    # the method fields come after the iDRO ones, as before the settings moved to their methods
    names = list(args_fields)
    assert names.index("max_length") < names.index("modir_lambda") < names.index("berm_alpha") < names.index("rmsc_k")


def test_method_settings_parse_from_the_command_line():
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(IDROTrainingArguments).parse_args_into_dataclasses(
        [
            "--output_dir",
            "x",
            "--modir_lambda",
            "0.25",
            "--berm_beta",
            "0.5",
            "--rmsc_k",
            "2",
            "--rmsc_weak_pairs",
            "7",
        ]
    )
    assert (args.modir_lambda, args.berm_beta, args.rmsc_k, args.rmsc_weak_pairs) == (0.25, 0.5, 2, 7)
    assert IDROTrainingArguments(output_dir="x", rmsc_weak_mode="ict").rmsc_weak_mode == "ict"


# ------------------------------------------------------------------------------------------------ a toy method
@dataclasses.dataclass
class ToySettings:
    toy_c: float = 0.5


class DotTerm(nn.Module):
    """An extra loss term: c · mean(q · p) over the batch's queries and positives."""

    def __init__(self, c: float):
        super().__init__()
        self.c = c
        self.calls = 0

    def compute(self, model, embeddings, outputs, context):
        self.calls += 1
        return {"toy_loss": self.c * (embeddings[0] * embeddings[1]).sum(-1).mean()}


class Toy(Method):
    name = "toy"
    label = "Toy"
    display_name = "Toy (a test method)"
    citation = {"title": "A toy method", "bibtex": "@misc{toy2099,\n  title = {A toy method}\n}"}
    settings = ToySettings
    reads_target_corpora = True

    def __init__(self, settings=None, target_corpora=()):
        super().__init__(settings or ToySettings())
        self.term = DotTerm(self.config.toy_c)
        self.batches: list[list[int]] = []
        self.restored: int | None = None
        self.target_corpora_read = [Path(str(c)).name for c in target_corpora]

    @classmethod
    def build(cls, model, args, data, *, target_corpora=(), target_queries=(), **overrides):
        return cls(cls.settings_from(args, **overrides), target_corpora)

    def loss_terms(self):
        return [self.term]

    def before_batch(self, trainer, rows):
        self.batches.append(rows.tolist())

    def state_tensors(self):
        return {"batches_seen": torch.tensor(len(self.batches))}

    def load_state_tensors(self, tensors):
        self.restored = int(tensors["batches_seen"])

    def after_save(self, trainer, output_dir):
        Path(output_dir, "toy_was_here.txt").write_text("saved")

    def stage_info(self, args):
        return {"Toy": f"c={self.config.toy_c:g}"}


@pytest.fixture
def toy_registered():
    register_method(Toy)
    try:
        yield Toy
    finally:
        unregister_method("toy")
    assert get_method("toy") is None


def _toy_trainer(tiny_st_dir, tiny_beir, tmp_path, **kw):
    torch.manual_seed(0)
    model = load_encoder(str(tiny_st_dir))
    base = dict(
        output_dir=str(tmp_path / "o"),
        per_device_train_batch_size=8,
        max_steps=2,
        num_clusters=2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=3,
        learning_rate=1e-3,
        dataloader_drop_last=True,
    )
    args = IDROTrainingArguments(**{**base, **kw})
    data = RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="bm25")
    loss, data, setup = configure_methods(["toy"], model, args, data, None, [str(tiny_beir)])
    trainer = IDROTrainer(model=model, args=args, train_dataset=data, loss=loss)
    setup(trainer)
    return trainer, trainer.methods[0]


def test_a_toy_method_changes_the_loss_by_its_hand_computed_term(toy_registered, tiny_st_dir, tiny_beir, tmp_path):
    known = r"choose from \['modir', 'berm', 'rmsc', 'toy'\]"  # the registered toy is a known method
    with pytest.raises(ValueError, match=r"unknown method\(s\) \['nope'\]; " + known):
        validate_methods(["toy", "nope"])
    trainer, toy = _toy_trainer(tiny_st_dir, tiny_beir, tmp_path, idro_preset="uniform")
    assert isinstance(toy, Toy) and toy.term in list(trainer.idro_loss.auxiliary)
    model = trainer.model
    model.eval()  # no dropout: the same batch gives the same embeddings every time
    rows = torch.arange(8)
    with torch.no_grad():
        total = trainer.compute_loss(model, {"label": rows})
        toy.term.c = 0.0
        base = trainer.compute_loss(model, {"label": rows})
        features = trainer.materialize(rows)[0]
        q, p = (model(dict(f))["sentence_embedding"] for f in features[:2])
    hand = 0.5 * float((q * p).sum(-1).mean())
    assert abs(hand) > 1e-3  # the term is not trivially zero
    assert float(total) - float(base) == pytest.approx(hand, rel=1e-4, abs=1e-5)
    assert toy.term.calls == 2 and toy.batches[:2] == [list(range(8))] * 2  # both hooks ran on this batch


def test_a_toy_method_trains_checkpoints_and_reaches_the_card(toy_registered, tiny_st_dir, tiny_beir, tmp_path):
    trainer, toy = _toy_trainer(tiny_st_dir, tiny_beir, tmp_path, save_strategy="steps", save_steps=1)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 2 and all("toy_loss" in h and "retrieval_loss" in h for h in logged)
    assert len(toy.batches) == 2 and all(len(b) == 8 for b in toy.batches)
    tensors, _ = trainer.state_for_checkpoint()
    assert int(tensors["method_toy_batches_seen"]) == 2
    trainer.load_checkpoint_state(str(tmp_path / "o" / "checkpoint-1"))
    assert toy.restored == 1  # what the step-1 checkpoint saved
    assert (tmp_path / "o" / "checkpoint-1" / "toy_was_here.txt").is_file()
    trainer.finalize()
    card = (tmp_path / "o" / "README.md").read_text()
    assert "Toy (a test method)" in card and "toy2099" in card and "c=0.5" in card
    assert "Toy read the **documents** of: " + tiny_beir.name in card
    provenance = json.loads((tmp_path / "o" / "hf_cocodr_provenance.json").read_text())
    assert "toy" in provenance["methods"] and provenance["method_cards"]["toy"]["citation"]["title"] == "A toy method"


def test_a_method_with_loss_terms_needs_an_idro_loss(toy_registered, tiny_st_dir, tmp_path):
    from datasets import Dataset
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from hf_cocodr.errors import ConfigError

    model = load_encoder(str(tiny_st_dir))
    ds = Dataset.from_dict({"anchor": [f"query {i}" for i in range(8)], "positive": [f"doc {i}" for i in range(8)]})
    args = IDROTrainingArguments(
        output_dir=str(tmp_path / "o"), per_device_train_batch_size=4, report_to="none", use_cpu=True
    )
    trainer = IDROTrainer(model=model, args=args, train_dataset=ds, loss=MultipleNegativesRankingLoss(model))
    with pytest.raises(ConfigError, match="'toy' adds loss terms: it needs an IDROLoss"):
        trainer.add_method(Toy())
