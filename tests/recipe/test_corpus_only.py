"""Adaptation from the corpus alone: the recipe's pseudo-query distillation (OUT/queries, the plan, the training, the
resume), the teacher check before it and the label-free guard that exports the adapted model only where it reads
better on held-out clozes."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from hf_cocodr.recipe import run_recipe

CFG = dict(pseudo_queries=64, guard_queries=12, distill_side="query", save_hybrid=False)


pytestmark = pytest.mark.usefixtures("own_cache")  # each test its own cache (tests/conftest.py)


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_pseudo_query_distillation_plans_trains_guards_and_resumes(tiny_st_dir, tiny_beir, tmp_path, caplog):
    """No query of the user's: the schedule distils on pseudo-queries drawn from the corpus, under a budget (the
    teacher's ranking of them probed and planned), the guard reads held-out ones, and a second call finds every
    stage finished with the same inputs."""
    args = (str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), tmp_path / "out")
    run_recipe(*args, evals=[f"{tiny_beir}:dev"], config={**CFG, "guard": "record"}, max_minutes=30.0)
    rec = json.loads((tmp_path / "out" / "recipe.json").read_text())
    assert rec["schedule"]["kind"] == "no_mlm_head" and "pseudo-queries drawn from" in rec["schedule"]["why"]
    assert rec["steps_trained"]["distill"] >= 1 and set(rec["steps_trained"]) == {"distill"}
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["fixed_costs"]["distill_teacher_rank"] > 0  # ranking the pseudo-queries is a planned cost
    counts = rec["queries"][tiny_beir.name]
    assert counts["train_pseudo_queries"] + counts["guard_pseudo_queries"] <= 64 + 12  # (the toy corpus gives fewer)
    assert counts["train_queries"] == 0 and 0 < counts["guard_pseudo_queries"] <= 12
    train = _rows(tmp_path / "out" / "queries" / f"{tiny_beir.name}.train.jsonl")
    rows = _rows(tmp_path / "out" / "queries" / f"{tiny_beir.name}.guard.jsonl")
    held, clozes = [r for r in rows if r["kind"] != "cloze"], [r for r in rows if r["kind"] == "cloze"]
    assert len(train) == counts["train_pseudo_queries"] and len(held) == counts["guard_pseudo_queries"]
    assert len(clozes) == counts["guard_clozes"] > 0
    trained = {r["doc_id"] for r in train}
    assert not trained & {r["doc_id"] for r in held + clozes}  # the guard's documents never trained
    assert all(c["text"] not in c["rest"] and c["dropped"] for c in clozes)
    # the teacher was checked before the distillation (guard: record distils whatever it reads)
    assert set(rec["teacher_check"]) >= {"leads", "verdict", "queries", "why"}
    # no pseudo-query is a query of the evaluation split (compared as the overlap guard compares)
    from hf_cocodr.data.beir import load_queries
    from hf_cocodr.data.target_queries import judged_query_ids, normalize_query

    dev_ids = set(judged_query_ids(tiny_beir, "dev"))
    queries = load_queries(tiny_beir)
    dev = {normalize_query(t) for i, t in zip(queries["_id"], queries["text"]) if i in dev_ids}
    assert not dev & {normalize_query(r["text"]) for r in train + held}
    # the guard's reading is recorded (record: the adapted model is kept whatever it reads)
    guard = rec["guard"]
    reading = guard["readings"]["pseudo_queries"]
    assert reading["queries"] == len(held) and guard["kept"] == "adapted" and guard["mode"] == "record"
    assert reading["verdict"] in ("worse", "better", "no difference")
    assert reading["difference"] == pytest.approx(reading["adapted"] - reading["start"], abs=2e-4)
    assert guard["readings"]["cloze"]["queries"] == guard["readings"]["cloze_hybrid"]["queries"] == len(clozes)
    assert guard["decided_on"] == ["cloze", "cloze_hybrid"]
    card = (tmp_path / "out" / "model" / "README.md").read_text()
    assert f"trained on {counts['train_pseudo_queries']} pseudo-queries drawn from the target corpora" in card
    assert "docs/adaptation.md#adaptation-from-the-corpus-alone" in card  # what the corpus-only path gains
    assert "The label-free guard compared the adapted model with the starting model" in card
    before = {p.name: p.read_bytes() for p in (tmp_path / "out" / "queries").iterdir()}
    with caplog.at_level(logging.INFO, logger="hf_cocodr.recipe"):
        run_recipe(*args, evals=[f"{tiny_beir}:dev"], config={**CFG, "guard": "record"}, max_minutes=30.0)
    assert any("stage distill: already finished" in r.getMessage() for r in caplog.records)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out" / "queries").iterdir()} == before


def _scramble_query_route(folder) -> None:
    """The saved asymmetric model with its query route's weights replaced by random ones (a model made worse on
    purpose); its document route is untouched."""
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.modeling.asymmetric import query_modules

    model = SentenceTransformer(str(folder), device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in query_modules(model)[0].parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    model.save(str(folder))


def test_the_guard_keeps_the_start_for_a_model_made_worse(tiny_st_dir, tiny_beir, tmp_path, monkeypatch):
    """The distillation's model with its query side scrambled is never exported: the tiny random start finds the
    clozes' rests no better than chance either, so the clozes cannot show a gain (``unverified``) where the
    held-out pseudo-queries read it worse; the recipe exports the starting model and says why in recipe.json and on
    the card (a reading that sees the harm: tests/retrieval/test_held_out.py)."""
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.recipe.stages.distill import DistillStage

    train = DistillStage.train

    def train_then_scramble(self, run):
        marker = train(self, run)
        _scramble_query_route(run.dir(self.name))
        return marker

    monkeypatch.setattr(DistillStage, "train", train_then_scramble)
    out = tmp_path / "out"
    run_recipe(
        str(tiny_st_dir),
        [str(tiny_beir)],
        str(tiny_beir),
        out,
        config={**CFG, "guard_queries": 40, "distill_steps": 2},
    )
    rec = json.loads((out / "recipe.json").read_text())
    guard = rec["guard"]
    assert guard["verdict"] in ("worse", "unverified") and guard["kept"] == "start"
    assert guard["readings"]["pseudo_queries"]["verdict"] == "worse"  # recorded beside, not decided on
    # the exported model is the starting one: its query vectors are the start's
    texts = ["alpha beta gamma", "a query about kernels"]
    start, final = SentenceTransformer(str(tiny_st_dir)), SentenceTransformer(str(out / "model"))
    assert np.allclose(final.encode_query(texts), start.encode_query(texts), atol=1e-5)
    card = (out / "model" / "README.md").read_text()
    assert "so this model is the starting model, unchanged" in card


def test_a_model_the_guard_cannot_tell_from_the_start_is_not_exported(tiny_st_dir, tiny_beir, tmp_path):
    """A model whose vectors are the start's (here: the distillation at a learning rate of 0) reads no difference:
    the guard cannot show a gain, the verdict is ``unverified`` and ``guard: on`` exports the starting model."""
    out = tmp_path / "out"
    cfg = {**CFG, "distill_steps": 2, "distill": {"learning_rate": 0.0}}
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
    guard = json.loads((out / "recipe.json").read_text())["guard"]
    reading = guard["readings"]["cloze"]
    assert reading["difference"] == pytest.approx(0.0, abs=1e-9) and reading["verdict"] == "no difference"
    assert guard["verdict"] == "unverified" and guard["kept"] == "start" and "cannot show a gain" in guard["why"]
    card = (out / "model" / "README.md").read_text()
    assert "the guard could not show that the adapted model is better, so this model is the starting model" in card


@pytest.mark.parametrize("mode", ["on", "record"])
def test_the_guard_cannot_vouch_for_a_document_side_trained_on_pseudo_queries(tiny_st_dir, tiny_beir, tmp_path, mode):
    """The whole model distilled on pseudo-queries learns what the held-out pseudo-queries test: their reading is
    recorded and not decided on, the verdict is ``unverified``; ``guard: on`` exports the starting model and says
    why, ``guard: record`` keeps the adapted one; the card says which."""
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "out"
    cfg = {**CFG, "distill_side": "full", "distill_steps": 2, "guard": mode}
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
    guard = json.loads((out / "recipe.json").read_text())["guard"]
    assert guard["verdict"] == "unverified" and guard["decided_on"] == []
    assert "document side on pseudo-queries" in guard["not_decided"]["cloze"]
    assert guard["readings"]["cloze"]["queries"] > 0  # read and recorded all the same
    texts = ["alpha beta gamma", "a query about kernels"]
    start, final = SentenceTransformer(str(tiny_st_dir)), SentenceTransformer(str(out / "model"))
    same = np.allclose(final.encode_document(texts), start.encode_document(texts), atol=1e-5)
    card = (out / "model" / "README.md").read_text()
    assert "the readings are not decided on" in card
    if mode == "on":
        assert guard["kept"] == "start" and "no reading can vouch" in guard["why"] and same
        assert "the guard could not show that the adapted model is better, so this model is the starting model" in card
    else:
        assert guard["kept"] == "adapted" and not same  # (its document side trained)
        assert "it recorded it only: `guard: record`" in card


def test_the_readings_a_document_side_trained_on_pseudo_queries_shaped():
    """Where the distillation trained the document side on pseudo-queries every held-out reading is shaped (recorded,
    not decided on); the query side's run, or one that trained on the user's queries alone, shapes none."""
    from types import SimpleNamespace

    from hf_cocodr.recipe.guard import READINGS, shaped_readings

    counts = [{"train_pseudo_queries": 10}, {"train_pseudo_queries": 0}]
    full = SimpleNamespace(distill_side="full", skip_distill=False, target_queries=[], pseudo_queries=10)
    assert set(shaped_readings(full, counts)) == set(READINGS)
    assert shaped_readings(SimpleNamespace(**{**vars(full), "distill_side": "query"}), counts) == {}
    assert shaped_readings(full, [{"train_pseudo_queries": 0}]) == {}  # the user's queries alone trained
    assert shaped_readings(SimpleNamespace(**{**vars(full), "skip_distill": True}), counts) == {}


def test_the_users_queries_all_train_and_the_guard_holds_out_pseudo_queries_alone(tiny_beir, tmp_path):
    """Every one of the user's target queries is in the training file (none is withheld for the guard, which reads
    held-out pseudo-queries only), and the counts say so."""
    from types import SimpleNamespace

    from hf_cocodr.recipe import RecipeConfig, choose_schedule
    from hf_cocodr.recipe.queries import prepare_queries

    log = tmp_path / "log.jsonl"
    asked = [f"user query number {i} about topic {i % 5}" for i in range(30)]
    log.write_text("".join(json.dumps({"text": t}) + "\n" for t in asked))
    cfg, _ = choose_schedule(RecipeConfig(target_queries=[str(log)], guard_queries=12), False)
    out = tmp_path / "out"
    run = SimpleNamespace(cfg=cfg, target_corpora=[str(tiny_beir)], evals=[], model=str(tmp_path / "none"), out=out)
    (entry,) = prepare_queries(run)
    train, held = _rows(entry.train), _rows(entry.guard)
    assert [r["text"] for r in train] == asked and entry.counts["train_queries"] == 30
    assert held and all(r.get("doc_id") for r in held) and "guard_queries" not in entry.counts
    assert all(r["kind"] == "cloze" for r in held if "rest" in r)  # the clozes: documents no training read


def test_a_teacher_that_does_not_lead_the_start_is_not_distilled(tiny_st_dir, tiny_beir, tmp_path, monkeypatch):
    """The teacher's BM25 side made useless on purpose (its rankings shuffled: the hybrid then ranks no better than
    the starting model alone): the teacher check reads no lead, the distillation does not run, the starting model
    is exported, and recipe.json and the card say why in one line."""
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.retrieval.index import BM25Index

    search = BM25Index.search

    def shuffled(self, queries, k):
        scores, rows = search(self, queries, k)
        rng = np.random.default_rng(len(queries))
        return scores, np.stack([rng.permutation(self.ntotal)[: rows.shape[1]] for _ in rows])

    monkeypatch.setattr(BM25Index, "search", shuffled)
    out = tmp_path / "out"
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config={**CFG, "distill_steps": 2})
    rec = json.loads((out / "recipe.json").read_text())
    check = rec["teacher_check"]
    assert check["leads"] is False and check["verdict"] != "better" and "does not lead" in check["why"]
    assert rec["steps_trained"]["distill"] == 0 and rec["guard"]["verdict"] == "not read"
    texts = ["alpha beta gamma", "a query about kernels"]
    start, final = SentenceTransformer(str(tiny_st_dir)), SentenceTransformer(str(out / "model"))
    assert np.allclose(final.encode_query(texts), start.encode_query(texts), atol=1e-5)
    card = (out / "model" / "README.md").read_text()
    assert "it did not, so the distillation was not run and this model is the starting model" in card


def test_a_query_side_models_hybrids_keep_the_starts_fusion(tiny_st_dir, tiny_beir, tmp_path):
    """The adapted model trained its query side alone: its saved hybrid and its evaluated hybrid keep the fusion the
    start's got on the same corpus (the saved one: as the start's saved hybrid would be fitted; the evaluated one: as
    the start's evaluation fitted it), so the two hybrids differ by the query encoder alone; a model whose documents
    are encoded otherwise is fitted for itself."""
    from hf_cocodr.modeling.loading import load_encoder
    from hf_cocodr.recipe.fusions import kept_eval_fusion, shares_documents
    from hf_cocodr.retrieval.hybrid import HybridRetriever

    out = tmp_path / "out"
    cfg = {**CFG, "guard": "record", "save_hybrid": True}
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, evals=[f"{tiny_beir}:dev"], config=cfg,
               max_minutes=30.0)  # fmt: skip
    start, adapted = load_encoder(str(tiny_st_dir)), load_encoder(str(out / "model"))
    assert shares_documents(adapted, start)
    assert json.loads((out / "recipe.json").read_text())["guard"]["kept"] == "adapted"  # (the trained model)
    fitted = HybridRetriever.build(start, str(tiny_beir)).fusion  # the start's, fitted without labels
    saved = json.loads((out / "hybrid" / tiny_beir.name / "hybrid.json").read_text())["fusion"]
    assert (saved["normalize"], saved["dense_weight"]) == (fitted.normalize, fitted.dense_weight)
    grid, mine = saved["fit"]["grid_ndcg_at_10"], fitted.fit["grid_ndcg_at_10"]  # (the start's fit: its curves,
    for norm, curve in mine.items():  # up to the batch and precision the run encoded in)
        assert grid[norm] == pytest.approx(curve, abs=0.01)
    ev = json.loads((out / "eval.json").read_text())[f"{tiny_beir}:dev"]
    start_fusion = ev["start"]["hybrid"]["fusion"]
    assert ev["hybrid"]["fusion"] == start_fusion and start_fusion["fit"]["real_queries"] > 0
    other = load_encoder(str(tiny_st_dir))
    with torch.no_grad():  # a document side that trained: its own fit
        next(other.parameters()).add_(1.0)
    assert not shares_documents(other, start) and kept_eval_fusion(other, start, ev["start"]) is None
    assert kept_eval_fusion(adapted, start, ev["start"]) == start_fusion


def test_the_guards_rows_are_read_whatever_characters_their_texts_hold(tmp_path):
    """A held-out document's text may hold a character ``str.splitlines`` breaks at (U+0085 in MS MARCO, U+2028, a
    form feed): the queries module writes it as it is (JSON leaves non-ASCII unescaped), and the guard reads every
    row whole."""
    from hf_cocodr.recipe.guard import read_rows
    from hf_cocodr.recipe.queries import _write

    rows = [{"_id": "a", "text": "one\x85two"}, {"_id": "b", "text": "three\u2028four\x0cfive\rsix"}]
    _write(tmp_path / "q.jsonl", rows)
    assert read_rows(tmp_path / "q.jsonl") == rows
