from __future__ import annotations

import math
import socket
from pathlib import Path

import pytest

from hf_cocodr.evaluation.evaluator import (
    BEIRRetrievalEvaluator,
    load_retrieval_metric,
    retrieval_metric_path,
    run_to_metric_inputs,
)
from hf_cocodr.evaluation.metrics import compute_metrics

L2 = math.log2
QRELS = {"q1": {"d1": 1, "d2": 1}, "q2": {"d1": 2, "d2": 1, "d5": 0}, "q3": {"d9": 1}}
RUN = {
    "q1": {"d3": 0.9, "d1": 0.8, "d4": 0.7, "d2": 0.6},
    "q2": {"d2": 0.9, "d1": 0.8},
    # q3 retrieved nothing (counts as zero); q4 is not judged (ignored).
    "q4": {"d1": 1.0},
}
# hand-computed nDCG@10 of RUN (see test_hand_computed_case): q1, q2 and q3 (0) averaged
NDCG10 = ((1 / L2(3) + 1 / L2(5)) / (1 + 1 / L2(3)) + (1 / L2(2) + 2 / L2(3)) / (2 / L2(2) + 1 / L2(3))) / 3


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="module")
def metric():
    return load_retrieval_metric(keep_in_memory=True)


@pytest.mark.parametrize("as_folder", [False, True])
def test_evaluate_load_is_offline_and_imports_hf_cocodr(no_network, as_folder):
    import evaluate

    path = retrieval_metric_path()
    assert Path(path).is_file() and (Path(path).parent / "README.md").is_file()
    module = evaluate.load(str(Path(path).parent) if as_folder else path, keep_in_memory=True)
    assert type(module).__name__ == "RetrievalMetrics"
    assert type(module).__module__.startswith("evaluate_modules.")  # the cached copy, not the package file
    assert set(module.features) == {"query_ids", "predictions", "references"}
    out = module.compute(**run_to_metric_inputs(RUN, QRELS), k_values=[10])
    assert set(out) == {"ndcg@10", "recall@10", "mrr@10", "map@10"}


def test_hand_computed_case(metric):
    out = metric.compute(**run_to_metric_inputs(RUN, QRELS), k_values=(3, 10))
    q1_ndcg = (1 / L2(3) + 1 / L2(5)) / (1 + 1 / L2(3))  # relevant at ranks 2 and 4, ideal: ranks 1 and 2
    q2_ndcg = (1 / L2(2) + 2 / L2(3)) / (2 / L2(2) + 1 / L2(3))  # grades 1 then 2, ideal 2 then 1 (linear gains)
    assert out["ndcg@10"] == pytest.approx((q1_ndcg + q2_ndcg + 0) / 3, abs=1e-9)
    assert out["mrr@10"] == pytest.approx((1 / 2 + 1 / 1 + 0) / 3)
    assert out["mrr@3"] == pytest.approx((1 / 2 + 1 / 1 + 0) / 3)
    assert out["recall@3"] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert out["recall@10"] == pytest.approx((1 + 1 + 0) / 3)
    # MAP@10: q1 precision at the relevant ranks 2 and 4 is 1/2 and 2/4; q2 is perfect.
    assert out["map@10"] == pytest.approx((0.5 + 1 + 0) / 3)
    # @3 cuts q1 after its first relevant document (rank 2); q2 is unchanged
    q1_ndcg3 = (1 / L2(3)) / (1 + 1 / L2(3))
    assert out["ndcg@3"] == pytest.approx((q1_ndcg3 + q2_ndcg + 0) / 3, abs=1e-9)
    assert out["map@3"] == pytest.approx((0.5 / 2 + 1 + 0) / 3)  # q1: precision 1/2 at rank 2, over 2 relevant
    assert set(out) == {f"{m}@{k}" for m in ("ndcg", "recall", "mrr", "map") for k in (3, 10)}


def test_brief_single_query_case(metric):
    out = metric.compute(
        query_ids=["q1"],
        predictions=[{"doc_ids": ["d3", "d1", "d4", "d2"], "scores": [0.9, 0.8, 0.7, 0.6]}],
        references=[{"doc_ids": ["d1", "d2"], "grades": [1, 1]}],
        k_values=[10],
    )
    assert out["ndcg@10"] == pytest.approx((1 / L2(3) + 1 / L2(5)) / (1 + 1 / L2(3)), abs=1e-9)
    assert out["mrr@10"] == 0.5
    assert out["recall@10"] == 1.0


def test_default_k_values_batches_and_per_query(metric):
    inputs = run_to_metric_inputs(RUN, QRELS)
    assert set(metric.compute(**inputs)) == set(compute_metrics(QRELS, RUN))  # default cut-offs 1..1000
    at_once = metric.compute(**inputs, k_values=[10])
    for i in reversed(range(len(inputs["query_ids"]))):  # streamed row by row, in another order == all at once
        metric.add_batch(**{key: values[i : i + 1] for key, values in inputs.items()})
    assert metric.compute(k_values=[10]) == at_once
    assert at_once["ndcg@10"] == pytest.approx(NDCG10, abs=1e-9)
    out = metric.compute(**inputs, k_values=[10], per_query=True)
    per_query = out["per_query"]
    assert set(per_query) == {"q1", "q2", "q3"}  # the judged queries; q4 is not judged
    assert [per_query[q]["mrr@10"] for q in ("q1", "q2", "q3")] == [0.5, 1.0, 0.0]
    assert per_query["q1"]["recall@10"] == 1.0 and per_query["q3"]["ndcg@10"] == 0.0
    five = load_retrieval_metric(keep_in_memory=True, k_values=[5])
    assert set(five.compute(**inputs)) == {"ndcg@5", "recall@5", "mrr@5", "map@5"}


def test_duplicate_and_malformed_rows(metric):
    inputs = run_to_metric_inputs(RUN, QRELS)
    doubled = {key: values + values[:1] for key, values in inputs.items()}  # verbatim repeat (sampler padding)
    once = metric.compute(**inputs, k_values=[10])
    assert metric.compute(**doubled, k_values=[10]) == once
    assert once["ndcg@10"] == pytest.approx(NDCG10, abs=1e-9)  # the repeated query counted once
    conflicting = {key: list(values) for key, values in doubled.items()}
    conflicting["predictions"][-1] = {"doc_ids": ["d1"], "scores": [1.0]}
    with pytest.raises(ValueError, match="several rows"):
        metric.compute(**conflicting)
    with pytest.raises(ValueError, match="parallel lists"):
        metric.compute(
            query_ids=["q"],
            predictions=[{"doc_ids": ["a", "b"], "scores": [1.0]}],
            references=[{"doc_ids": ["a"], "grades": [1]}],
        )
    with pytest.raises(ValueError, match="more than once"):
        metric.compute(
            query_ids=["q"],
            predictions=[{"doc_ids": ["a", "a"], "scores": [1.0, 0.5]}],
            references=[{"doc_ids": ["a"], "grades": [1]}],
        )


def test_evaluator_matches_evaluate_retrieval(tiny_st_dir, tiny_beir, tmp_path, caplog):
    from hf_cocodr import evaluate_retrieval, load_beir, load_encoder

    model = load_encoder(str(tiny_st_dir))
    evaluator = BEIRRetrievalEvaluator(tiny_beir, "dev", top_k=100, k_values=(1, 10, 100))
    assert evaluator.primary_metric == "toy_dev_ndcg@10"
    assert evaluator.greater_is_better
    got = evaluator(model, output_path=str(tmp_path))
    ref = evaluate_retrieval(model, tiny_beir, "dev", top_k=100, k_values=(1, 10, 100), show_progress_bar=False)
    for key in ("ndcg@10", "recall@100", "mrr@10", "map@100", "ndcg@1"):
        assert got[f"toy_dev_{key}"] == ref[key], key
    assert set(got) == {f"toy_dev_{m}@{k}" for m in ("ndcg", "recall", "mrr", "map") for k in (1, 10, 100)}
    assert got["toy_dev_ndcg@100"] > 0.0 and got["toy_dev_recall@100"] > 0.0  # not a degenerate all-zero run
    lines = (tmp_path / "BEIR-Retrieval_evaluation_toy_dev_results.csv").read_text().splitlines()
    assert len(lines) == 2 and lines[0].startswith("epoch,steps,ndcg@1")

    # A pre-loaded BEIRData, a custom name and main metric.
    data = load_beir(tiny_beir, "dev")
    other = BEIRRetrievalEvaluator(data, top_k=100, name="mine", main_metric="recall@100", write_csv=False)
    assert other.primary_metric == "mine_recall@100"
    assert other(model)["mine_ndcg@10"] == ref["ndcg@10"]
    with pytest.raises(ValueError, match="main_metric"):
        BEIRRetrievalEvaluator(data, k_values=(100,))
    assert not [r for r in caplog.records if "disagree" in r.getMessage()]


def test_evaluator_inside_sentence_transformer_trainer(tiny_st_dir, tiny_beir, tmp_path):
    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from hf_cocodr import load_beir, load_encoder

    train = load_beir(tiny_beir, "train")
    text = dict(zip(train.corpus["_id"], train.corpus["text"]))
    queries = dict(zip(train.queries["_id"], train.queries["text"]))
    pairs = [(queries[q], text[d]) for q, docs in sorted(train.qrels.items()) for d in docs][:8]
    dataset = Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})

    torch.manual_seed(0)
    model = load_encoder(str(tiny_st_dir))
    evaluator = BEIRRetrievalEvaluator(tiny_beir, "dev", top_k=100, k_values=(10, 100))
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        eval_strategy="steps",
        eval_steps=1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
    )
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=dataset, loss=MultipleNegativesRankingLoss(model), evaluator=evaluator
    )
    trainer.train()
    logged = [row for row in trainer.state.log_history if "eval_toy_dev_ndcg@10" in row]
    assert [row["step"] for row in logged] == [1, 2]
    assert all(0.0 <= row["eval_toy_dev_recall@100"] <= 1.0 for row in logged)
    # The last in-training number is what the CLI code path reports for the trained weights.
    from hf_cocodr import evaluate_retrieval

    final = evaluate_retrieval(model, tiny_beir, "dev", top_k=100, k_values=(10, 100), show_progress_bar=False)
    assert logged[-1]["eval_toy_dev_ndcg@10"] == final["ndcg@10"]
    assert (tmp_path / "out" / "eval" / "BEIR-Retrieval_evaluation_toy_dev_results.csv").is_file()
