"""A loaded model wherever a model is taken: ``CocoPretrainer``, ``run_recipe``, ``evaluate_retrieval``, the MTEB run
and ``HybridRetriever.build`` given a ``SentenceTransformer`` (COCO also a ``transformers`` masked-LM model) give the
result and the provenance they give with its folder; a model changed in memory is recorded by its weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import coco_args
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer

from hf_cocodr import CocoPretrainer, HybridRetriever, evaluate_retrieval, run_recipe
from hf_cocodr.modeling.loading import model_source
from hf_cocodr.rundir.run_record import model_fingerprint

# the corpus-only recipe at its smallest (no source data: tests/recipe/test_source_data.py)
CFG = dict(pseudo_queries=32, guard="off", distill_side="query", distill_steps=2, save_hybrid=False)


def _provenance(folder) -> dict:
    prov = json.loads((folder / "hf_cocodr_provenance.json").read_text())
    return {k: v for k, v in prov.items() if k not in ("versions", "stage_runs")}


@pytest.fixture(scope="module")
def recipes(tiny_st_dir, tiny_beir, tmp_path_factory):
    """The recipe run from the folder and from the model loaded from it."""
    root = tmp_path_factory.mktemp("loaded")
    evals = [f"{tiny_beir}:dev"]
    by_folder = run_recipe(str(tiny_st_dir), [str(tiny_beir)], None, root / "folder", evals=evals, config=CFG)
    loaded = SentenceTransformer(str(tiny_st_dir))
    by_object = run_recipe(loaded, [str(tiny_beir)], None, root / "object", evals=evals, config=CFG)
    return root, by_folder, by_object


def test_the_recipe_from_a_loaded_model_is_the_recipe_from_its_folder(recipes, tiny_st_dir):
    root, by_folder, by_object = recipes
    assert by_object == by_folder
    assert _provenance(root / "object" / "model") == _provenance(root / "folder" / "model")
    for route in ("query_0_Transformer", "document_0_Transformer"):  # the trained model, bit for bit
        a, b = (load_file(root / run / "model" / route / "model.safetensors") for run in ("folder", "object"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    record = json.loads((root / "object" / "recipe.json").read_text())
    assert record["model"] == str(tiny_st_dir)


def test_evaluation_and_the_hybrid_from_a_loaded_model(tiny_st_dir, tiny_beir):
    loaded = SentenceTransformer(str(tiny_st_dir))
    keys = ("ndcg@10", "recall@100", "mrr@10", "num_queries")
    a = evaluate_retrieval(loaded, tiny_beir, "dev", show_progress_bar=False, hybrid=True)
    b = evaluate_retrieval(str(tiny_st_dir), tiny_beir, "dev", show_progress_bar=False, hybrid=True)
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys} and a["fusion"] == b["fusion"]
    built = [HybridRetriever.build(m, tiny_beir) for m in (loaded, str(tiny_st_dir))]
    assert built[0].meta["model"] == built[1].meta["model"] == str(tiny_st_dir.resolve())
    assert built[0].meta["model_fingerprint"] == built[1].meta["model_fingerprint"]
    assert built[0].search(["alpha beta"], k=5) == built[1].search(["alpha beta"], k=5)


def test_the_mteb_run_of_a_loaded_model_has_its_folders_meta(recipes, tiny_beir, tmp_path):
    """The meta of a trained model (its training data, its base) is read from the folder it was loaded from."""
    from hf_cocodr.evaluation.mteb import run_mteb

    folder = recipes[0] / "folder" / "model"
    runs = {}
    for kind, model in (("folder", str(folder)), ("object", SentenceTransformer(str(folder)))):
        runs[kind] = run_mteb(model, tiny_beir, "dev", "Toy", "me/toy", "r1", tmp_path / kind)
    metas = {k: json.loads(open(r["model_meta"]).read()) for k, r in runs.items()}
    assert metas["object"] == metas["folder"] and metas["folder"]["training_datasets"]
    assert runs["object"]["tasks"]["Toy"]["ndcg@10"] == runs["folder"]["tasks"]["Toy"]["ndcg@10"]


def test_a_model_changed_in_memory_runs_as_a_copy_recorded_by_its_weights(tiny_st_dir):
    loaded = SentenceTransformer(str(tiny_st_dir))
    assert model_source(loaded) == str(tiny_st_dir)  # unchanged: its folder
    with torch.no_grad():
        next(loaded.parameters()).add_(0.5)
    copy = model_source(loaded)
    assert copy != str(tiny_st_dir)
    prov = json.loads(open(f"{copy}/hf_cocodr_provenance.json").read())
    assert prov["base_model_source"]["in_memory"] is True
    assert prov["base_model_source"]["weights_sha256"] == model_fingerprint(loaded)["weights_sha256"]
    again = SentenceTransformer(copy)
    assert torch.equal(next(again.parameters()), next(loaded.parameters()))


@pytest.mark.parametrize("kind", ["sentence-transformers", "masked-lm"])
def test_coco_from_a_loaded_model_is_coco_from_its_folder(kind, tiny_st_dir, tiny_bert_dir, tiny_beir, tmp_path):
    from transformers import AutoModelForMaskedLM

    folder = tiny_st_dir if kind == "sentence-transformers" else tiny_bert_dir
    loaded = SentenceTransformer(str(folder)) if kind == "sentence-transformers" else None
    if loaded is None:
        loaded = AutoModelForMaskedLM.from_pretrained(str(folder))
    outs = {}
    for name, model in (("folder", str(folder)), ("object", loaded)):
        trainer = CocoPretrainer(model, coco_args(tmp_path / name), corpora=[str(tiny_beir)])
        trainer.train()
        outs[name] = Path(trainer.finalize())
    a, b = (load_file(outs[n] / "model.safetensors") for n in ("folder", "object"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _provenance(outs["object"]) == _provenance(outs["folder"])
    starts = [json.loads((outs[n] / "hf_cocodr_provenance.json").read_text())["stage_runs"][0] for n in outs]
    assert starts[0]["start_model"] == starts[1]["start_model"] and starts[0]["start_model"]  # the folder's files


def test_coco_from_a_masked_lm_changed_in_memory_records_its_weights(tiny_bert_dir, tiny_beir, tmp_path):
    from transformers import AutoModelForMaskedLM

    lm = AutoModelForMaskedLM.from_pretrained(str(tiny_bert_dir))
    with torch.no_grad():
        lm.bert.embeddings.word_embeddings.weight.mul_(1.5)
    start = model_fingerprint(lm)
    trainer = CocoPretrainer(lm, coco_args(tmp_path / "out"), corpora=[str(tiny_beir)])
    trainer.train()
    source = _provenance(Path(trainer.finalize()))["base_model_source"]
    assert source == {"in_memory": True, **start}
