"""Adaptation from the corpus alone: the recipe's pseudo-query distillation (OUT/queries, the plan, the training, the
resume) and the label-free guard that keeps the starting model where the adapted one reads worse."""

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
    held = _rows(tmp_path / "out" / "queries" / f"{tiny_beir.name}.guard.jsonl")
    assert len(train) == counts["train_pseudo_queries"] and len(held) == counts["guard_pseudo_queries"]
    assert not {r["doc_id"] for r in train} & {r["doc_id"] for r in held}  # the guard's documents never trained
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
    """The distillation's model with its query side scrambled reads worse on the held-out pseudo-queries: the
    recipe exports the starting model, says so in recipe.json and on the card."""
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
    assert guard["verdict"] == "worse" and guard["kept"] == "start" and "beyond one standard error" in guard["why"]
    reading = guard["readings"]["pseudo_queries"]
    assert reading["difference"] < -reading["se"] < 0
    # the exported model is the starting one: its query vectors are the start's
    texts = ["alpha beta gamma", "a query about kernels"]
    start, final = SentenceTransformer(str(tiny_st_dir)), SentenceTransformer(str(out / "model"))
    assert np.allclose(final.encode_query(texts), start.encode_query(texts), atol=1e-5)
    card = (out / "model" / "README.md").read_text()
    assert "the adapted model read worse, so this model is the starting model" in card


def test_the_guard_passes_a_model_that_reads_as_the_start(tiny_st_dir, tiny_beir, tmp_path):
    """A model whose vectors are the start's (here: the distillation at a learning rate of 0) reads no difference,
    and the guard keeps it."""
    out = tmp_path / "out"
    cfg = {**CFG, "distill_steps": 2, "distill": {"learning_rate": 0.0}}
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
    guard = json.loads((out / "recipe.json").read_text())["guard"]
    reading = guard["readings"]["pseudo_queries"]
    assert reading["difference"] == pytest.approx(0.0, abs=1e-9) and reading["verdict"] == "no difference"
    assert guard["kept"] == "adapted" and guard["mode"] == "on"


def test_the_verdict_rests_on_the_pseudo_queries_reading():
    """Hand-made per-query nDCG@10 of the start and the adapted model: within one standard error is no difference
    (the adapted model kept), below it worse."""
    from hf_cocodr.recipe.guard import decide, paired_reading

    worse = paired_reading([0.9, 0.8, 0.9, 0.7], [0.3, 0.2, 0.4, 0.1])
    pseudo = paired_reading([0.5, 0.6, 0.7, 0.4], [0.52, 0.59, 0.7, 0.41])
    # by hand: differences 0.02, -0.01, 0, 0.01: mean 0.005, SD sqrt(0.0005 / 3), SE = SD / 2 = 0.0065
    assert pseudo["difference"] == 0.005 and pseudo["se"] == 0.0065 and pseudo["verdict"] == "no difference"
    assert worse["verdict"] == "worse"
    assert decide({"pseudo_queries": pseudo}) == "not worse"
    assert decide({"pseudo_queries": worse}) == "worse"


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
    assert "document side on pseudo-queries" in guard["not_decided"]["pseudo_queries"]
    assert guard["readings"]["pseudo_queries"]["queries"] > 0  # read and recorded all the same
    texts = ["alpha beta gamma", "a query about kernels"]
    start, final = SentenceTransformer(str(tiny_st_dir)), SentenceTransformer(str(out / "model"))
    same = np.allclose(final.encode_document(texts), start.encode_document(texts), atol=1e-5)
    card = (out / "model" / "README.md").read_text()
    assert "reading is not decided on" in card
    if mode == "on":
        assert guard["kept"] == "start" and "no reading can vouch" in guard["why"] and same
        assert "no reading could vouch for the adapted model, so this model is the starting model" in card
    else:
        assert guard["kept"] == "adapted" and not same  # (its document side trained)
        assert "the guard recorded it only" in card


def test_a_reading_the_training_shaped_is_not_decided_on():
    """Hand-made readings: a shaped reading decides nothing (a better one cannot vouch, a worse one cannot refuse);
    with no reading left to rest on the verdict is ``unverified``; the query side's run is decided as before."""
    from types import SimpleNamespace

    from hf_cocodr.recipe.guard import decide, paired_reading, shaped_readings

    better = paired_reading([0.5, 0.6, 0.7, 0.4], [0.7, 0.8, 0.9, 0.6])
    worse = paired_reading([0.5, 0.6, 0.7, 0.4], [0.3, 0.4, 0.55, 0.2])
    assert better["verdict"] == "better" and worse["verdict"] == "worse"
    shaped = {"pseudo_queries": "trained on them"}
    assert decide({"pseudo_queries": better}, shaped) == "unverified"
    assert decide({"pseudo_queries": worse}, shaped) == "unverified"
    assert decide({"pseudo_queries": better}) == "not worse" and decide({"pseudo_queries": worse}) == "worse"
    assert decide({}, shaped) == "not worse"  # no pseudo-query held out: nothing shaped was read
    counts = [{"train_pseudo_queries": 10}, {"train_pseudo_queries": 0}]
    full = SimpleNamespace(distill_side="full", skip_distill=False, target_queries=[], pseudo_queries=10)
    assert set(shaped_readings(full, counts)) == {"pseudo_queries"}
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
