"""A recipe run encodes each corpus once per model: the starting model's encoding serves its teacher, its
evaluation and (cached) a repeated run; the adapted model's serves its evaluation and its saved hybrid."""

from __future__ import annotations

import json

import pytest

from hf_cocodr.recipe import run_recipe
from hf_cocodr.recipe.stages.distill import PROBE_DOCS, DistillStage
from hf_cocodr.retrieval import encoding

CFG = dict(
    skip_coco=True,
    wise_alpha=None,
    distill_steps=2,
    distill_k=3,
    distill={"per_device_train_batch_size": 4, "save_steps": 2},
)


pytestmark = pytest.mark.usefixtures("own_cache")  # each test its own cache (tests/conftest.py)


def test_a_run_encodes_each_corpus_once_per_model(tiny_bert_nomlm_dir, tiny_beir, tmp_path, monkeypatch):
    import hf_cocodr.retrieval.encoding as enc
    from hf_cocodr.retrieval.hybrid import _corpus_ids_texts

    calls, real, corpus = [], enc.encode_texts, sorted(_corpus_ids_texts(tiny_beir)[1])

    def counting(model, texts, *, kind, **kw):
        if kind == "document" and sorted(texts) == corpus:  # the whole toy corpus (80 documents, one chunk)
            calls.append(id(model))
        return real(model, texts, kind=kind, **kw)

    monkeypatch.setattr(enc, "encode_texts", counting)
    # the full distillation: two models encode the corpus (a query-side run encodes it once: test_query_side.py)
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "distill_side": "full"}
    args = (str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir))
    run_recipe(*args, tmp_path / "run", evals=[f"{tiny_beir}:dev"], config=cfg)
    record = json.loads((tmp_path / "run" / "recipe.json").read_text())["corpus_encodings"]
    encoded = [(r["document_encoder"], r["corpus"]) for r in record if r["source"] == "encoded"]
    # the starting model (teacher, start evaluation) and the adapted one (evaluation, saved hybrid): one each
    assert len(encoded) == len(set(encoded)) == 2 and len({c for _, c in encoded}) == 1
    assert len(calls) == 2
    assert {r["source"] for r in record} == {"encoded", "disk cache", "memory"}
    assert all(r["seconds"] >= 0 and r["num_docs"] == 80 for r in record)
    # the same run again into another folder: the starting model encodes nothing (its encoding is cached)
    calls.clear()
    run_recipe(*args, tmp_path / "again", evals=[f"{tiny_beir}:dev"], config=cfg)
    again = json.loads((tmp_path / "again" / "recipe.json").read_text())["corpus_encodings"]
    start_key = next(r["document_encoder"] for r in record)
    assert all(r["source"] != "encoded" for r in again if r["document_encoder"] == start_key)


def test_a_cold_two_minute_run_plans_and_records_each_fixed_cost(tiny_st_dir, tiny_beir, tmp_path, monkeypatch):
    """From an empty cache, the plan charges the teacher's encoding of the corpus, its BM25 index and the ranking
    of the queries as measured, lists each fixed cost in plan.json, and the run records the encodings it did; the
    probe times the documents' encoding only where the run pays for it (cold), never on a warm run."""
    probed = []  # (kind, texts) of each encode_texts call made while the distillation's probe runs
    real_encode, real_probe = encoding.encode_texts, DistillStage.probe

    def counting(model, texts, **kw):
        if probing:
            probed.append((kw["kind"], len(texts)))
        return real_encode(model, texts, **kw)

    probing: list[int] = []

    def probe(self, run):
        probing.append(1)
        try:
            return real_probe(self, run)
        finally:
            probing.clear()

    monkeypatch.setattr(encoding, "encode_texts", counting)
    monkeypatch.setattr(DistillStage, "probe", probe)
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "distill_side": "query"}
    del cfg["distill_steps"]
    out = tmp_path / "cold"
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg, max_minutes=2.0)
    plan = json.loads((out / "plan.json").read_text())
    costs = plan["fixed_costs"]
    assert {"spent_before_the_plan", "model_loads_exports", "distill_teacher_encode", "distill_teacher_bm25"} <= set(
        costs
    )
    assert costs["distill_teacher_encode"] > 0 and costs["distill_teacher_rank"] > 0  # cold: 80 documents to encode
    assert abs(sum(costs.values()) - plan["fixed_seconds"]) <= 0.2
    assert plan["throughput"]["distill_teacher_s"] == pytest.approx(
        sum(plan["throughput"][f"distill_teacher_{n}_s"] for n in ("encode", "bm25", "fit", "check", "rank")), abs=0.02
    )
    record = json.loads((out / "recipe.json").read_text())
    assert record["steps_trained"]["distill"] >= 1
    # the teacher (fitted, the schedule's choice given queries) is fitted to the corpus it builds: a planned cost
    assert record["schedule"]["chosen"]["distill_teacher_weight"] == "fit" and costs["distill_teacher_fit"] > 0
    # the teacher's encoding, the only one: the guard (its hybrids of both models) and the saved hybrid read it from
    # the disk cache, their documents going through the starting model's route (the start's hybrid whose fusion the
    # saved one keeps reads the final model's index, held in memory: the same route)
    sources = [r["source"] for r in record["corpus_encodings"]]
    assert sources[0] == "encoded" and len(sources) > 1 and "disk cache" in sources[1:]
    assert set(sources[1:]) <= {"disk cache", "memory"}
    # cold, the probe encoded the corpus's 80 documents (fewer than it samples: all of them) after a warm-up batch
    assert [n for kind, n in probed if kind == "document"][-1] == 80
    # warm: the same run again plans no encoding (the teacher's indexes and the encoding are cached)
    probed.clear()
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), tmp_path / "warm", config=cfg, max_minutes=2.0)
    warm = json.loads((tmp_path / "warm" / "plan.json").read_text())["fixed_costs"]
    assert warm.get("distill_teacher_encode", 0) == 0 and warm.get("distill_teacher_bm25", 0) == 0
    assert "distill_teacher_fit" not in warm  # (the cached teacher was fitted when it was built)
    # and its probe encodes no corpus: documents only to time the teacher check's (a sample, the check's real cost)
    assert probed and all(n <= PROBE_DOCS // 4 for kind, n in probed if kind == "document")


def test_a_bf16_run_encodes_every_corpus_in_bf16_and_plans_it_cold(tiny_st_dir, tiny_beir, tmp_path):
    """encode_precision bf16 (what auto picks where the machine computes bf16 natively): each encoding of the run
    is in bf16, recipe.json says so, and an fp32 run's cached encoding and teacher are not reused: the plan charges
    the teacher's encoding again."""
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "distill_side": "query"}
    del cfg["distill_steps"]
    args = (str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir))
    run_recipe(*args, tmp_path / "fp32", config={**cfg, "encode_precision": "fp32"}, max_minutes=2.0)
    evals = [f"{tiny_beir}:dev"]
    run_recipe(*args, tmp_path / "bf16", evals=evals, config={**cfg, "encode_precision": "bf16"}, max_minutes=2.0)
    fp32 = json.loads((tmp_path / "fp32" / "recipe.json").read_text())
    bf16 = json.loads((tmp_path / "bf16" / "recipe.json").read_text())
    assert fp32["precision"]["encoding"] == "fp32" and bf16["precision"]["encoding"] == "bf16"
    assert {r["precision"] for r in fp32["corpus_encodings"]} == {"fp32"}
    # the teacher's encoding, read back by the start's evaluation and the saved hybrid, and the adapted model's
    # query side (its documents go through the starting model's route: the same vectors)
    assert {r["precision"] for r in bf16["corpus_encodings"]} == {"bf16"}
    assert [r["source"] for r in bf16["corpus_encodings"]].count("encoded") == 1
    # the evaluations say in which precision they encoded
    evaluated = (tmp_path / "bf16" / "model" / "eval.json").read_text()
    assert '"encode_precision": "bf16"' in evaluated and '"encode_precision": "fp32"' not in evaluated
    costs = json.loads((tmp_path / "bf16" / "plan.json").read_text())["fixed_costs"]
    assert costs["distill_teacher_encode"] > 0 and costs["distill_teacher_bm25"] > 0  # cold for bf16
    hybrid = json.loads((tmp_path / "bf16" / "hybrid" / tiny_beir.name / "hybrid.json").read_text())
    assert hybrid["encode_precision"] == "bf16"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_fine_tuning_mines_its_negatives_in_the_runs_corpus_precision_unless_told(
    precision, tmp_path, monkeypatch
):
    """The self-negative refreshes encode the corpus in the run's precision; a ``finetune`` option of the user's
    wins; the stage's identity (its arguments) does not change with it, as the run's precision never did."""
    from types import SimpleNamespace

    from hf_cocodr.recipe import RecipeConfig
    from hf_cocodr.recipe.plan import Plan
    from hf_cocodr.recipe.stages import finetune

    monkeypatch.setattr(finetune, "idro_trainer", lambda run, args, *a, **kw: args)  # the arguments it trains with

    def trained_with(options):
        cfg = RecipeConfig(finetune=options, finetune_preset="paper")
        run = SimpleNamespace(cfg=cfg, similarity="cosine", encode_precision=precision, dir=lambda n: tmp_path / n)
        run.arguments = {"finetune": finetune.FinetuneStage().arguments(run)}
        run.plan, run.train_data, run.methods, run.target_corpora = Plan(), None, (), ()
        return run.arguments["finetune"], finetune.FinetuneStage().build_trainer(run, 4)

    kw, args = trained_with({})
    assert args.negatives_encode_precision == precision and "negatives_encode_precision" not in kw
    assert trained_with({"negatives_encode_precision": "int8"})[1].negatives_encode_precision == "int8"


def test_the_fit_of_the_teacher_is_charged_per_document_and_pseudo_query():
    """A fit draws at most one pseudo-query per document (400 at most): each is encoded, its source document
    encoded again without it, and the corpus indexed for BM25 again."""
    from hf_cocodr.recipe.stages.distill import fit_seconds

    # 1000 documents: 400 pseudo-queries x (0.1 s a document + 0.01 s a query) + 1000 x 0.001 s of BM25
    assert fit_seconds(1000, 0.1, 0.001, 0.01) == pytest.approx(45.0)
    # 100 documents: at most 100 pseudo-queries
    assert fit_seconds(100, 0.1, 0.001, 0.01) == pytest.approx(11.1)
