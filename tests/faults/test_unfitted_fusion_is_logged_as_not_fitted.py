"""A fusion the label-free fit could not fit is logged as "not fitted: <reason>", never as fitted (issue 52, item 7):
in a built retriever and in ``evaluate --hybrid``; a fusion the fit did fit is still logged as fitted."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hf_cocodr.modeling.loading import load_encoder
from hf_cocodr.retrieval.hybrid import HybridRetriever


def _one_sentence_corpus(folder: Path) -> Path:
    """Documents of one sentence each: no inverse-cloze pseudo-query can be drawn from them."""
    (folder / "qrels").mkdir(parents=True)
    words = ["harbour", "violin", "glacier", "orchard", "lantern", "meteor", "canyon", "pepper", "quartz", "saddle"]
    with open(folder / "corpus.jsonl", "w") as f:
        for i in range(30):
            text = f"The {words[i % 10]} number {i} stands beside the {words[(i * 3) % 10]} near town"
            f.write(json.dumps({"_id": f"one{i}", "title": "", "text": text}) + "\n")
    with open(folder / "queries.jsonl", "w") as f:
        for i in range(6):
            f.write(json.dumps({"_id": f"ask{i}", "text": f"{words[i]} beside town"}) + "\n")
    with open(folder / "qrels" / "dev.tsv", "w") as f:
        f.write("query-id\tcorpus-id\tscore\n" + "".join(f"ask{i}\tone{i}\t1\n" for i in range(6)))
    return folder


def _fit_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "fitted" in r.getMessage()]


def test_a_built_retriever_logs_the_fallback_as_not_fitted(tiny_st_dir, tiny_beir, tmp_path, caplog):
    corpus = _one_sentence_corpus(tmp_path / "single-sentences")
    with caplog.at_level(logging.INFO):
        hybrid = HybridRetriever.build(str(tiny_st_dir), corpus)
    assert "fallback" in hybrid.fusion.fit  # the fit took its fallback ...
    lines = _fit_lines(caplog)
    assert lines and all("not fitted: " in line for line in lines), lines  # ... and the log says so, with why
    assert any("pseudo-queries" in line for line in lines), lines
    # a corpus the fit can fit is logged as fitted
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert "fallback" not in HybridRetriever.build(str(tiny_st_dir), tiny_beir).fusion.fit
    lines = _fit_lines(caplog)
    assert lines and not any("not fitted" in line for line in lines), lines


def test_evaluate_hybrid_logs_the_fallback_as_not_fitted(tiny_st_dir, tiny_beir, tmp_path, caplog):
    from hf_cocodr import evaluate_retrieval

    corpus = _one_sentence_corpus(tmp_path / "short-docs")
    with caplog.at_level(logging.INFO):
        result = evaluate_retrieval(
            load_encoder(str(tiny_st_dir)), corpus, "dev", hybrid=True, show_progress_bar=False
        )
    assert "fallback" in result["fusion"]["fit"]
    lines = _fit_lines(caplog)
    assert lines and all("not fitted: " in line for line in lines), lines
    caplog.clear()
    with caplog.at_level(logging.INFO):
        model = load_encoder(str(tiny_st_dir))
        fit = evaluate_retrieval(model, tiny_beir, "dev", hybrid=True, show_progress_bar=False)["fusion"]["fit"]
    assert "fallback" not in fit
    lines = _fit_lines(caplog)
    assert lines and not any("not fitted" in line for line in lines), lines
