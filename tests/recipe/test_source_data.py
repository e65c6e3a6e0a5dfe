"""Only what the path needs: the corpus-only recipe runs without source data (from a BEIR folder and from the same data
laid out as a Hub repository, with the same scores), and a schedule that fine-tunes on a source task refuses in one
line naming the stage."""

from __future__ import annotations

import json

import pytest
import tiny
from helpers import run_cli

from hf_cocodr.cli import main
from hf_cocodr.recipe import run_recipe

# the corpus-only schedule at its smallest: 2 query-side distillation steps on pseudo-queries, no guard
CFG = dict(pseudo_queries=32, guard="off", distill_side="query", distill_steps=2, save_hybrid=False)

pytestmark = pytest.mark.usefixtures("own_cache")  # each test its own cache (tests/conftest.py)


def test_the_corpus_only_recipe_needs_no_source_data_and_reads_a_hub_layout_as_its_folder(
    tiny_st_dir, tiny_beir, tmp_path, capsys
):
    """``hf-cocodr recipe`` without ``--source-data`` on a model without an MLM head runs the corpus-only schedule;
    the same data given as an mteb-layout repository (target corpus and eval) trains and scores the same."""
    rc = main(
        ["recipe", "--model", str(tiny_st_dir), "--target-corpus", str(tiny_beir), "--eval", f"{tiny_beir}:dev",
         "--output_dir", str(tmp_path / "folder"), "--config", _config(tmp_path)]
    )  # fmt: skip
    assert rc == 0
    from_folder = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    record = json.loads((tmp_path / "folder" / "recipe.json").read_text())
    assert record["source_data"] is None and record["schedule"]["kind"] == "no_mlm_head"
    assert set(record["steps_trained"]) == {"distill"}
    mteb, _ = tiny.hub_layouts(tiny_beir, tmp_path / "hub")
    result = run_recipe(str(tiny_st_dir), [str(mteb)], None, tmp_path / "hub-run", evals=[f"{mteb}:dev"], config=CFG)
    assert result[f"{mteb}:dev"]["ndcg@10"] == from_folder[f"{tiny_beir}:dev"]["ndcg@10"]
    assert result[f"{mteb}:dev"]["start"] == from_folder[f"{tiny_beir}:dev"]["start"]
    record = json.loads((tmp_path / "hub-run" / "recipe.json").read_text())
    assert record["target_corpora"] == [str(mteb)]  # named as given, not by its cached copy


def _config(tmp_path) -> str:
    import yaml

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(CFG))
    return str(path)


def test_a_schedule_that_fine_tunes_refuses_without_source_data(tiny_bert_dir, tiny_beir, tmp_path, capsys):
    """A model with an MLM head gets COCO and then the fine-tune on the source task: without ``--source-data`` that
    is one line naming the stage, before the output folder is claimed."""
    line = run_cli(["recipe", "--model", tiny_bert_dir, "--target-corpus", tiny_beir, "--output_dir", tmp_path / "o"],
                   capsys)  # fmt: skip
    assert "the source fine-tuning stage of the mlm_head schedule trains on the labelled source task" in line
    assert "--source-data" in line and not (tmp_path / "o").exists()


def test_a_datasets_object_is_a_target_corpus_as_its_folder(tiny_st_dir, tiny_beir, tmp_path):
    """The README's example: a ``datasets.Dataset`` of documents (``_id``, ``title``, ``text``) as the target corpus of
    the corpus-only recipe, its hybrid saved beside the model."""
    import datasets

    docs = datasets.Dataset.from_json(str(tiny_beir / "corpus.jsonl"))
    cfg = {**CFG, "save_hybrid": True}
    by_object = run_recipe(str(tiny_st_dir), [docs], None, tmp_path / "o", evals=[f"{tiny_beir}:dev"], config=cfg)
    by_folder = run_recipe(str(tiny_st_dir), [tiny_beir], None, tmp_path / "f", evals=[f"{tiny_beir}:dev"], config=cfg)
    assert by_object[f"{tiny_beir}:dev"]["ndcg@10"] == by_folder[f"{tiny_beir}:dev"]["ndcg@10"]
    assert (tmp_path / "o" / "hybrid" / "dataset" / "hybrid.json").is_file()
