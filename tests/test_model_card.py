from __future__ import annotations

import json
import shutil

import pytest
import yaml

from hf_cocodr.model_card import write_model_card

STAGES = {
    "stages": [
        {
            "type": "coco",
            "title": "COCO continuous contrastive pretraining",
            "method": "coco",
            "corpora": ["scifact", "nfcorpus"],
            "steps": 500,
            "documents per step": 64,
        },
        {
            "type": "finetune",
            "title": "iDRO fine-tuning",
            "method": "idro",
            "source_data": "squad-v1.1:train",
            "steps": 300,
            "queries per step": 32,
            "iDRO preset": "paper",
            "K (clusters)": 50,
            "tau": 100.0,
        },
    ],
    "methods": ["coco", "idro", "groupdro"],
    "datasets": ["scifact", "nfcorpus", "squad-v1.1:train"],
    "base_model": "sentence-transformers/all-MiniLM-L6-v2",
    "model_name": "acme/cocodr-mini",
}


@pytest.fixture()
def model_dir(tiny_st_dir, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(tiny_st_dir, d)
    (d / "eval.json").write_text(json.dumps({"scifact:train": {"ndcg@10": 0.61234, "recall@100": 0.9, "mrr@10": 0.5}}))
    (d / "mteb_results" / "results" / "acme__cocodr-mini" / "abc").mkdir(parents=True)
    (d / "mteb_results" / "results" / "acme__cocodr-mini" / "abc" / "SciFact.json").write_text(
        json.dumps(
            {
                "task_name": "SciFact",
                "scores": {"test": [{"ndcg_at_10": 0.7, "recall_at_100": 0.95, "mrr_at_10": 0.6}]},
            }
        )
    )
    return d


def load(model_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir))


def test_card_sections_metadata_and_citations(model_dir):
    path = write_model_card(model_dir, load(model_dir), STAGES)
    text = path.read_text()
    front, body = text.split("---\n", 2)[1:]
    meta = yaml.safe_load(front)
    assert meta["library_name"] == "sentence-transformers" and meta["pipeline_tag"] == "sentence-similarity"
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and meta["license"] == "apache-2.0"
    assert {"coco", "idro", "groupdro", "sentence-transformers"} <= set(meta["tags"])
    # local data (folder names, name:split) is not a Hub dataset id: described in the text, not in `datasets`
    assert "datasets" not in meta
    assert "read from local folders" in body and "scifact, nfcorpus, squad-v1.1:train" in body
    for section in (
        "## Model details",
        "## Usage",
        "## Training",
        "### Zero-shot disclosure",
        "## Evaluation",
        "## Citation",
    ):
        assert section in body, section
    assert "**CLS token" in body and "**dot product" in body
    assert 'SentenceTransformer("acme/cocodr-mini")' in body and "model.similarity(" in body
    assert "| iDRO preset | paper |" in body and "| K (clusters) | 50 |" in body and "| tau | 100.0 |" in body
    assert "the **documents** of: nfcorpus, scifact" in body and "never saw the queries" in body
    assert "squad-v1.1:train" in body
    assert "| scifact:train | hf-cocodr evaluate | 0.6123 | 0.9000 | 0.5000 |" in body
    assert "| SciFact (test) | MTEB | 0.7000 | 0.9500 | 0.6000 |" in body
    for cite in ("yu2022cocodr", "gao2021condenser", "sagawa2020groupdro"):
        assert cite in body
    # the stored provenance lets later stages extend the card
    assert json.loads((model_dir / "hf_cocodr_provenance.json").read_text())["methods"] == ["coco", "idro", "groupdro"]


def test_card_renders_identically_twice(model_dir):
    a = write_model_card(model_dir, load(model_dir), STAGES).read_text()
    b = write_model_card(model_dir, load(model_dir), STAGES).read_text()
    assert a == b


def test_card_without_training(model_dir):
    text = write_model_card(model_dir, load(model_dir), {}).read_text()
    assert "without training" in text and "No target corpus was read" in text


def test_card_refuses_tokens(model_dir):
    token = "hf_" + "A" * 30
    with pytest.raises(ValueError, match="looks like a Hugging Face token"):
        write_model_card(model_dir, load(model_dir), {**STAGES, "model_name": token})
    for p in model_dir.rglob("*"):
        if p.is_file():
            assert token.encode() not in p.read_bytes(), p


def test_card_lists_the_hybrids_mteb_results_beside_the_models_own(model_dir):
    """``hf-cocodr mteb --hybrid`` into the model's mteb_results: its rows are in the card's table, labelled hybrid,
    next to the dense rows, and stay out of the model-index (which states what the model alone scores)."""
    rev = model_dir / "mteb_results" / "results" / "acme__cocodr-mini-hybrid" / "abc"
    rev.mkdir(parents=True)
    (rev / "model_meta.json").write_text(json.dumps({"name": "acme/cocodr-mini-hybrid", "model_type": ["hybrid"]}))
    (rev / "SciFact.json").write_text(
        json.dumps(
            {
                "task_name": "SciFact",
                "scores": {"test": [{"ndcg_at_10": 0.75, "recall_at_100": 0.96, "mrr_at_10": 0.65}]},
            }
        )
    )
    text = write_model_card(model_dir, load(model_dir), STAGES).read_text()
    front, body = text.split("---\n", 2)[1:]
    assert "| SciFact (test) | MTEB | 0.7000 | 0.9500 | 0.6000 |" in body
    assert "| SciFact (test), hybrid with BM25 | MTEB | 0.7500 | 0.9600 | 0.6500 |" in body
    values = [m["value"] for r in yaml.safe_load(front)["model-index"][0]["results"] for m in r["metrics"]]
    assert 0.7 in values and 0.75 not in values


@pytest.mark.parametrize("layout", ["evaluate_hybrid", "recipe_summary"])
def test_hybrid_evaluation_is_not_the_models_score(model_dir, layout):
    """An ``eval.json`` entry of a hybrid evaluation: the model-index and the model's row hold the dense model's
    metrics (what the model alone scores), and the hybrid gets a row of its own, labelled, outside the model-index.
    ``evaluate --hybrid`` stores the hybrid at the top level (the model's metrics under "dense"); the recipe's
    summary stores the model's at the top level (the hybrid under "hybrid")."""
    dense = {"ndcg@10": 0.4, "recall@100": 0.8, "mrr@10": 0.3}
    hybrid = {"ndcg@10": 0.7, "recall@100": 0.9, "mrr@10": 0.6}
    entry = (
        {**hybrid, "dense": dense, "bm25": dict(dense)} if layout == "evaluate_hybrid" else {**dense, "hybrid": hybrid}
    )
    (model_dir / "eval.json").write_text(json.dumps({"scifact:dev": entry}))
    text = write_model_card(model_dir, load(model_dir), STAGES).read_text()
    meta = yaml.safe_load(text.split("---\n", 2)[1])
    ndcg = [
        m["value"]
        for r in meta["model-index"][0]["results"]
        if r["dataset"]["name"] == "scifact"
        for m in r["metrics"]
        if m["type"] == "ndcg_at_10"
    ]
    assert ndcg == [0.4]
    assert "| scifact:dev | hf-cocodr evaluate | 0.4000 | 0.8000 | 0.3000 |" in text
    assert "| scifact:dev, hybrid with BM25 | hf-cocodr evaluate | 0.7000 | 0.9000 | 0.6000 |" in text


def test_each_reader_of_the_target_queries_is_named(model_dir):
    """A distillation and a fine-tuning stage that both read unlabelled target queries: the card names both readers
    (a fine-tuning stage without a method that says it reads them is "fine-tuning")."""
    stages = [
        {"type": "finetune", "title": "contrastive fine-tuning", "method": "finetune", "target queries": ["a:train"]},
        {
            "type": "distill",
            "title": "hybrid-teacher distillation",
            "method": "distillation",
            "corpora": ["scifact"],
            "target queries": ["b:train"],
        },
    ]
    card = {"stages": stages, "methods": ["finetune"], "model_name": "acme/two-readers"}
    text = write_model_card(model_dir, load(model_dir), card).read_text()
    assert "The hybrid-teacher distillation and fine-tuning also read the **queries**" in text
    assert "the hybrid-teacher distillation read the **documents** of: scifact" in text


def test_eval_results_files_are_what_huggingface_hub_parses(model_dir, monkeypatch):
    """Beside the ``model-index`` (kept for older readers), the card writes every evaluation of the model as
    ``.eval_results/*.yaml``, which ``huggingface_hub``'s own parser reads back; ``push`` uploads them (computed from
    the folder, so a folder whose card predates them pushes them too). A Hub dataset evaluated names its id and
    revision."""
    from helpers import push_capturing
    from huggingface_hub import ModelCard, parse_eval_result_entries

    ev = json.loads((model_dir / "eval.json").read_text())
    ev["mteb/scifact@abc123:test"] = {"ndcg@10": 0.55, "recall@100": 0.8, "mrr@10": 0.4}
    (model_dir / "eval.json").write_text(json.dumps(ev))
    write_model_card(model_dir, load(model_dir), STAGES)
    files = sorted(p.relative_to(model_dir).as_posix() for p in (model_dir / ".eval_results").glob("*.yaml"))
    assert files == [".eval_results/mteb_scifact.yaml", ".eval_results/scifact.yaml"]
    entries = {}
    for name in files:
        for e in parse_eval_result_entries(yaml.safe_load((model_dir / name).read_text())):
            entries[(e.dataset_id, e.task_id, e.notes)] = e
    assert entries[("scifact", "train", "nDCG@10, split train")].value == 0.61234
    assert entries[("scifact", "train", "Recall@100, split train")].value == 0.9
    local = entries[("mteb/scifact", "test", "nDCG@10, split test")]
    assert local.value == 0.55 and local.dataset_revision == "abc123" and local.source_name == "hf-cocodr evaluate"
    mteb = entries[("mteb/scifact", "SciFact", "nDCG@10, split test")]
    assert mteb.value == 0.7 and mteb.source_name == "MTEB" and mteb.source_url
    assert len(entries) == 3 * 3  # every metric of every evaluation
    index = ModelCard.load(model_dir / "README.md").data.eval_results  # the legacy model-index stays
    assert {(r.dataset_type, r.metric_type, r.metric_value) for r in index} >= {
        ("scifact", "ndcg_at_10", 0.61234),
        ("mteb/scifact", "ndcg_at_10", 0.55),
        ("mteb/scifact", "ndcg_at_10", 0.7),
    }
    shutil.rmtree(model_dir / ".eval_results")  # a card written before these files existed
    uploaded = push_capturing(model_dir, monkeypatch, "acme/cocodr-mini", "hf_x")
    pushed = [k for k in uploaded if k.startswith(".eval_results/")]
    assert sorted(pushed) == files and not (model_dir / ".eval_results").exists()  # (the folder is only read)
    again = parse_eval_result_entries(yaml.safe_load(uploaded[".eval_results/scifact.yaml"]))
    assert {(e.notes, e.value) for e in again} >= {("nDCG@10, split train", 0.61234)}
