"""Each fault gets its one line, naming the path or option and the cause, before the expensive work (issue 66, item
7): a machine error says its message, not its class; a model folder without weights is refused before anything
loads; a finished stage is checked by its outputs, not by its marker alone; what the distillation needs of the
pseudo-queries is checked once they are drawn, before the teacher's work; a mix that is not a mix is one line; the
guard's state is said when it reads nothing; WiSE-FT's α is in (0, 1]."""

from __future__ import annotations

import errno
import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from hf_cocodr.cli import main
from hf_cocodr.errors import ConfigError, describe_os_error
from hf_cocodr.recipe import STAGES, RecipeConfig, Stage, run_recipe
from hf_cocodr.recipe.outputs import export_final

ONLY_TOY = dict(
    skip_coco=True, skip_finetune=True, target_pairs="none", skip_distill=True, wise_alpha=None, save_hybrid=False
)


def _one_line(capsys, command: str) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert err[0].startswith(f"hf-cocodr {command}: error: "), err[0]
    return err[0]


class Copies(Stage):
    """A stage whose output is a copy of the model it starts from (its weights in its folder)."""

    name = "copier"

    def __init__(self):
        self.calls = 0

    def cost(self, throughput, cfg, **kw):
        return replace(super().cost(throughput, cfg, **kw), steps=1)

    def train(self, run):
        self.calls += 1
        export_final(Path(run.current), run.dir(self.name))
        return {"steps": 1}


def _beir(folder: Path, texts: list[str]) -> Path:
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"s{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(texts))
    )
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "v1", "text": "winch"}) + "\n")
    (folder / "qrels" / "check.tsv").write_text("query-id\tcorpus-id\tscore\nv1\ts0\t1\n")
    return folder


# --------------------------------------------------------------------------------------- machine errors, weights
def test_a_machine_error_without_an_errno_says_its_message_not_its_class():
    said = describe_os_error(OSError("/srv/enc has no file named model.safetensors, pytorch_model.bin"))
    assert said == "/srv/enc has no file named model.safetensors, pytorch_model.bin"
    copy = shutil.Error([("/srv/enc/a.bin", "/out/a.bin", "[Errno 5] Input/output error"), ("x", "y", "z")])
    assert describe_os_error(copy) == (
        "copy failed: /srv/enc/a.bin -> /out/a.bin: [Errno 5] Input/output error (and 1 more entries)"
    )
    assert describe_os_error(OSError(errno.ENOSPC, "No space left on device", "/out/w")) == "/out/w: the disk is full"


def test_a_model_folder_without_weights_is_one_line_before_any_load(tiny_bert_dir, tmp_path, capsys):
    hollow = tmp_path / "encoder-hollow"
    shutil.copytree(tiny_bert_dir, hollow)
    for p in hollow.glob("*.safetensors"):
        p.unlink()
    assert main(["export", str(hollow), str(tmp_path / "exported")]) == 2
    line = _one_line(capsys, "export")
    assert f"{hollow} holds no weights" in line, line
    assert not (tmp_path / "exported").exists()


# ---------------------------------------------------------------------------------- a finished stage's outputs
def test_a_finished_stage_whose_weights_were_deleted_runs_again(tiny_st_dir, tiny_beir, tmp_path, caplog):
    target = _beir(tmp_path / "winches", [f"winch {i} hauls the mooring line at berth {i}" for i in range(12)])
    out, copier = tmp_path / "OUT", Copies()
    args = (str(tiny_st_dir), [str(target)], str(tiny_beir), out)
    cfg = {**ONLY_TOY, "guard": "off"}
    run_recipe(*args, config=cfg, stages=(*STAGES, copier))
    weights = out / copier.name / "model.safetensors"
    weights.unlink()
    with caplog.at_level(logging.WARNING, logger="hf_cocodr"):
        run_recipe(*args, config=cfg, stages=(*STAGES, copier))
    assert copier.calls == 2 and weights.is_file()
    assert any(f"{weights} is missing: running it again" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------- pseudo-queries before the teacher
def test_a_corpus_of_one_word_documents_is_refused_before_the_teacher_works(
    tiny_st_dir, tiny_beir, tmp_path, monkeypatch
):
    import hf_cocodr.retrieval.teacher as teacher

    def no_teacher(*a, **k):
        raise AssertionError("the teacher worked before the refusal")

    monkeypatch.setattr(teacher, "distill_dataset", no_teacher)
    monkeypatch.setattr(teacher, "teacher_retriever", no_teacher)
    target = _beir(tmp_path / "tags", [f"hawser{i}" for i in range(30)])
    cfg = dict(skip_coco=True, skip_finetune=True, target_pairs="none", skip_distill=False, pseudo_queries=24)
    with pytest.raises(ConfigError, match=r"pseudo_queries 24: the target corpora gave 0 distinct pseudo-queries "):
        run_recipe(str(tiny_st_dir), [str(target)], str(tiny_beir), tmp_path / "OUT", config=cfg)


def test_a_pseudo_query_mix_that_is_a_number_in_yaml_is_one_line(tiny_st_dir, tiny_beir, tmp_path, capsys):
    config = tmp_path / "recipe.yaml"
    config.write_text("pseudo_query_mix: 3\n")
    argv = ["recipe", "--model", str(tiny_st_dir), "--target-corpus", str(tiny_beir), "--source-data"]
    assert main([*argv, str(tiny_beir), "--output_dir", str(tmp_path / "OUT"), "--config", str(config)]) == 2
    line = _one_line(capsys, "recipe")
    assert "pseudo_query_mix must be KIND:WEIGHT pairs" in line and "got 3" in line, line
    assert not (tmp_path / "OUT").exists()


# ---------------------------------------------------------------------------------------- the guard's state
def test_the_guard_says_it_read_nothing_of_a_corpus_too_small_to_hold_out(tiny_st_dir, tiny_beir, tmp_path, caplog):
    target = _beir(tmp_path / "trio", ["the capstan turns", "the windlass hauls", "the davit swings"])
    out = tmp_path / "OUT"
    with caplog.at_level(logging.WARNING, logger="hf_cocodr"):
        run_recipe(
            str(tiny_st_dir),
            [str(target)],
            str(tiny_beir),
            out,
            config={**ONLY_TOY, "guard": "on", "pseudo_queries": 0},
            stages=(*STAGES, Copies()),
        )
    guard = json.loads((out / "recipe.json").read_text())["guard"]
    assert guard["mode"] == "on" and guard["verdict"] == "not read"
    assert "nothing could be held out of trio" in guard["why"]
    said = [r.getMessage() for r in caplog.records]
    assert any("nothing of trio is held out (3 documents, fewer than the 4" in m for m in said), said
    assert any(m.startswith("guard: not read (nothing could be held out of trio") for m in said), said


# ------------------------------------------------------------------------------------------------- WiSE's α
@pytest.mark.parametrize("alpha", [0, 0.0])
def test_a_wise_alpha_of_zero_is_refused(alpha):
    with pytest.raises(ConfigError, match=r"wise_alpha must be a number in \(0, 1\].*got 0"):
        RecipeConfig(wise_alpha=alpha).validate()
    RecipeConfig(wise_alpha=0.05).validate()  # any other α in (0, 1] stands


def test_wise_alpha_zero_on_the_command_line_is_one_line(tiny_st_dir, tiny_beir, tmp_path, capsys):
    argv = ["recipe", "--model", str(tiny_st_dir), "--target-corpus", str(tiny_beir), "--source-data"]
    assert main([*argv, str(tiny_beir), "--output_dir", str(tmp_path / "OUT"), "--wise-alpha", "0"]) == 2
    assert "wise_alpha must be a number in (0, 1]" in _one_line(capsys, "recipe")
    assert not (tmp_path / "OUT").exists()
