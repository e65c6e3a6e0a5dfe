"""Encoding precision for evaluation and negative mining (fp32 exact, bf16 autocast, int8 dynamic)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_cocodr import evaluate_retrieval, load_encoder
from hf_cocodr.modeling.precision import encoding_precision


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_evaluate_in_lower_precision_runs_and_leaves_the_model_as_it_was(precision, tiny_st_dir, tiny_beir):
    model = load_encoder(str(tiny_st_dir))
    before = _weights(model)
    exact = evaluate_retrieval(model, tiny_beir, "dev", show_progress_bar=False)
    low = evaluate_retrieval(model, tiny_beir, "dev", show_progress_bar=False, encode_precision=precision)
    assert low["encode_precision"] == precision and exact["encode_precision"] == "fp32"
    assert 0.0 <= low["ndcg@10"] <= 1.0 and low["num_queries"] == exact["num_queries"]
    after = _weights(model)
    assert all(torch.equal(before[k], after[k]) for k in before)  # int8 quantizes a copy, bf16 only autocasts
    again = evaluate_retrieval(model, tiny_beir, "dev", show_progress_bar=False)  # fp32 exactly as before

    def metrics(r):
        return {k: v for k, v in r.items() if not k.endswith("_seconds")}

    assert metrics(again) == metrics(exact)


def test_lower_precision_embeddings_are_close_but_not_identical(tiny_st_dir):
    model = load_encoder(str(tiny_st_dir))
    texts = [f"document number {i} about topic {i % 3}" for i in range(16)]
    exact = model.encode(texts, convert_to_numpy=True)
    with encoding_precision(model, "fp32") as m:
        assert m is model
        assert np.array_equal(m.encode(texts, convert_to_numpy=True), exact)
    for precision, tol in (("bf16", 5e-2), ("int8", 2e-1)):
        with encoding_precision(model, precision) as m:
            low = m.encode(texts, convert_to_numpy=True)
        assert low.dtype == np.float32 and low.shape == exact.shape
        scale = np.abs(exact).max()
        assert not np.array_equal(low, exact)
        assert np.abs(low - exact).max() <= tol * scale, precision


def test_bad_precision_is_refused_by_name(tiny_st_dir, tiny_beir, tmp_path, capsys):
    from hf_cocodr.cli import main
    from hf_cocodr.errors import ConfigError
    from hf_cocodr.finetuning import IDROTrainingArguments

    with pytest.raises(ConfigError, match="negatives_encode_precision"):
        IDROTrainingArguments(output_dir=str(tmp_path / "o"), negatives_encode_precision="fp8")
    with pytest.raises(ConfigError, match="encode_precision"):
        evaluate_retrieval(str(tiny_st_dir), tiny_beir, "dev", encode_precision="int4")
    assert main(["evaluate", str(tiny_st_dir), str(tiny_beir), "--split", "dev", "--encode-precision", "int4"]) == 2


def test_negative_refresh_in_int8(tiny_st_dir, tiny_beir, tmp_path):
    """Self-mined negatives from an int8 encoding of the corpus: the refresh runs and installs negatives."""
    from hf_cocodr.data.training import RetrievalTrainingData
    from hf_cocodr.finetuning import IDROTrainer, IDROTrainingArguments

    data = RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="bm25")
    args = IDROTrainingArguments(
        output_dir=str(tmp_path / "ft"),
        max_steps=2,
        per_device_train_batch_size=8,
        num_clusters=3,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        refresh_negatives_every_steps=1,
        negatives_encode_precision="int8",
        seed=1,
    )
    trainer = IDROTrainer(model=load_encoder(str(tiny_st_dir)), args=args, train_dataset=data)
    trainer.train()
    assert trainer.negatives_callback.encode_precision == "int8"
    assert data.negatives_source.startswith("self")
