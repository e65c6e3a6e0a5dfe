"""Output safety and run identity (issue 14): owner records, locks, checkpoint checksums, stage identities."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys

import pytest

from hf_cocodr.rundir.run_record import LOCK, RECORD, RunFolder, RunLockedError, RunMismatchError, read_record


def _digest(folder):
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _user_folder(path):
    path.mkdir(parents=True)
    (path / "thesis.tex").write_text("\\documentclass{article}")
    (path / "figures").mkdir()
    (path / "figures" / "plot.png").write_bytes(b"\x89PNG not really")
    return _digest(path)


def _finetune_cli(model, data, out, *extra):
    return [
        "finetune",
        "--model",
        str(model),
        "--train-data",
        str(data),
        "--output_dir",
        str(out),
        "--num-clusters",
        "3",
        "--max_steps",
        "2",
        "--save_steps",
        "1",
        "--per_device_train_batch_size",
        "8",
        "--use_cpu",
        "--seed",
        "3",
        *extra,
    ]


def test_a_users_folder_survives_every_writing_command(tiny_bert_dir, tiny_st_dir, tiny_beir, tmp_path, monkeypatch):
    """export, convert, pretrain, finetune, recipe and mteb into a folder of the user's files, into '.', '..' and a
    folder beside the model: each exits 2 with one line before any work, and every byte stays as it was."""
    from hf_cocodr.cli import main

    mine = tmp_path / "mine"
    before = _user_folder(mine)
    (mine / "sub").mkdir()
    monkeypatch.chdir(mine / "sub")
    before = _digest(mine)
    commands = []
    for target in (str(mine), ".", ".."):
        commands += [
            ["export", str(tiny_st_dir), target],
            ["convert", str(tiny_bert_dir), target],
            [
                "pretrain",
                "--model",
                str(tiny_bert_dir),
                "--corpus",
                str(tiny_beir),
                "--output_dir",
                target,
                "--max_steps",
                "1",
                "--use_cpu",
            ],
            _finetune_cli(tiny_st_dir, tiny_beir, target),
            [
                "recipe",
                "--model",
                str(tiny_bert_dir),
                "--target-corpus",
                str(tiny_beir),
                "--source-data",
                str(tiny_beir),
                "--output_dir",
                target,
            ],
            [
                "mteb",
                str(tiny_st_dir),
                str(tiny_beir),
                "--split",
                "dev",
                "--task-name",
                "Mine",
                "--model-name",
                "me/mine",
                "--revision",
                "r1",
                "--output-folder",
                target,
            ],
        ]
    for argv in commands:
        assert main(argv) == 2, argv
    assert _digest(mine) == before


def test_overwrite_writes_beside_the_users_files_and_never_touches_them(tiny_st_dir, tmp_path):
    from hf_cocodr.export import export_sentence_transformer

    mine = tmp_path / "mine"
    before = _user_folder(mine)
    export_sentence_transformer(str(tiny_st_dir), mine, overwrite_output_dir=True)
    after = _digest(mine)
    assert {k: after[k] for k in before} == before
    rec = read_record(mine)
    assert rec["command"] == "export" and set(rec["preexisting"]) == {"thesis.tex", "figures"}
    assert "modules.json" in rec["files"] and "thesis.tex" not in rec["files"]
    # an export again replaces only its own files; the user's stay byte for byte
    export_sentence_transformer(str(tiny_st_dir), mine, pooling="mean", similarity="cosine", overwrite_output_dir=True)
    after = _digest(mine)
    assert {k: after[k] for k in before} == before


def test_finetune_into_a_finished_run_and_a_resume_with_other_settings(tiny_st_dir, tiny_beir, tmp_path, capsys):
    """A fresh finetune into the folder of a finished run is refused; a resume with different settings names what
    differs; --overwrite_output_dir replaces the earlier run's files and the new run owns the folder."""
    from hf_cocodr.cli import main

    out = tmp_path / "ft"
    assert main(_finetune_cli(tiny_st_dir, tiny_beir, out)) == 0
    first = read_record(out)
    capsys.readouterr()
    assert main(_finetune_cli(tiny_st_dir, tiny_beir, out)) == 2
    assert "holds an earlier run" in capsys.readouterr().err
    assert (
        main(_finetune_cli(tiny_st_dir, tiny_beir, out, "--learning_rate", "1e-3", "--resume_from_checkpoint", "true"))
        == 2
    )
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "settings.learning_rate" in errors[0] and "--overwrite_output_dir" in errors[0]
    assert read_record(out) == first  # refused: nothing changed
    (out / "my_notes.md").write_text("mine")
    assert main(_finetune_cli(tiny_st_dir, tiny_beir, out, "--learning_rate", "1e-3", "--overwrite_output_dir")) == 0
    second = read_record(out)
    assert second["run_id"] != first["run_id"] and "my_notes.md" in second["preexisting"]
    assert (out / "my_notes.md").read_text() == "mine"
    markers = [json.loads((p / "hf_cocodr_checkpoint_complete.json").read_text()) for p in out.glob("checkpoint-*")]
    assert markers and all(m["run_id"] == second["run_id"] for m in markers)


def test_a_second_writer_is_locked_out_and_a_dead_writers_lock_is_taken_over(tmp_path, caplog):
    out = tmp_path / "out"
    first = RunFolder.claim(out, "finetune", {"a": 1})
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import sys; from hf_cocodr.rundir.run_record import RunFolder\n"
                "try:\n    RunFolder.claim(sys.argv[1], 'finetune', {'a': 1}, resume=True)\n"
                "except Exception as e:\n    print(type(e).__name__, e); sys.exit(3)\n"
            ),
            str(out),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    assert other.returncode == 3
    assert "RunLockedError" in other.stdout and f"pid {os.getpid()}" in other.stdout
    first.release()
    assert not (out / LOCK).exists()
    # a lock left by a process that no longer runs
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / LOCK).write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename, "started": "earlier"}))
    with caplog.at_level(logging.WARNING, logger="hf_cocodr"):
        again = RunFolder.claim(out, "finetune", {"a": 1}, resume=True)
    assert any("no longer running" in r.getMessage() for r in caplog.records)
    assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()
    again.release()
    # a live lock of another process on this host is refused with its pid
    (out / LOCK).write_text(json.dumps({"pid": os.getppid(), "host": os.uname().nodename, "started": "now"}))
    with pytest.raises(RunLockedError, match=f"pid {os.getppid()}"):
        RunFolder.claim(out, "finetune", {"a": 1}, resume=True)


def test_resume_identity_and_owner_rules_by_hand(tmp_path):
    out = tmp_path / "out"
    run = RunFolder.claim(out, "pretrain", {"model": "m", "settings": {"lr": 1}})
    (out / "checkpoint-1").mkdir()
    run.release()
    assert read_record(out)["files"] == ["checkpoint-1"]
    with pytest.raises(RunMismatchError, match="settings.lr"):
        RunFolder.claim(out, "pretrain", {"model": "m", "settings": {"lr": 2}}, resume=True)
    with pytest.raises(RunMismatchError, match="command"):
        RunFolder.claim(out, "finetune", {"model": "m", "settings": {"lr": 1}}, resume=True)
    same = RunFolder.claim(out, "pretrain", {"model": "m", "settings": {"lr": 1}}, resume=True)
    assert same.run_id == read_record(out)["run_id"]
    same.release()
    (out / RECORD).write_text("{not json")
    with pytest.raises(RunMismatchError, match="not readable JSON"):
        RunFolder.claim(out, "pretrain", {}, resume=True)


def test_a_run_killed_before_its_next_save_still_owns_what_it_declared(tmp_path):
    """A recipe declares its stage folders before writing them: killed between creating one and saving its record
    (SIGKILL runs no ``finally``), the resumed run still owns it, while a file someone else added stays foreign and a
    declared name that was there before the run is never adopted."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "model").mkdir()  # the user's, there before the run
    run = RunFolder.claim(out, "recipe", None, overwrite=True)
    run.expect(["stage", "model"])
    (out / "stage").mkdir()  # killed here: no save, no release
    (out / LOCK).unlink()
    (out / "notes.txt").write_text("someone else's")
    with pytest.raises(FileExistsError, match="notes.txt"):
        RunFolder.claim(out, "recipe", None, resume=True)
    (out / "notes.txt").unlink()
    again = RunFolder.claim(out, "recipe", None, resume=True)
    again.release()
    record = read_record(out)
    assert again.run_id == run.run_id
    assert record["files"] == ["stage"] and record["preexisting"] == ["model"]


def test_a_checkpoint_damaged_after_its_marker_falls_back_to_the_previous_one(
    tiny_st_dir, tiny_beir, tmp_path, caplog
):
    """Flip a byte of the newest checkpoint's weights after its marker: the resume warns, names it, continues from
    the previous intact checkpoint and ends exactly where the uninterrupted run ends."""
    import torch
    from safetensors.torch import load_file

    from hf_cocodr.cli import main

    ref = tmp_path / "ref"
    assert main(_finetune_cli(tiny_st_dir, tiny_beir, ref, "--max_steps", "4", "--save_total_limit", "5")) == 0
    out = tmp_path / "out"  # a run that got as far as checkpoint-3 (checkpoint-4 never written)
    import shutil

    assert main(_finetune_cli(tiny_st_dir, tiny_beir, out, "--max_steps", "4", "--save_total_limit", "5")) == 0
    shutil.rmtree(out / "checkpoint-4")
    weights = out / "checkpoint-3" / "model.safetensors"
    assert (out / "checkpoint-3" / "hf_cocodr_checkpoint_complete.json").is_file()
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF
    weights.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="hf_cocodr"):
        assert (
            main(
                _finetune_cli(
                    tiny_st_dir,
                    tiny_beir,
                    out,
                    "--max_steps",
                    "4",
                    "--save_total_limit",
                    "5",
                    "--resume_from_checkpoint",
                    "true",
                )
            )
            == 0
        )
    msgs = [r.getMessage() for r in caplog.records]
    assert any("checkpoint-3 is damaged" in m and "model.safetensors" in m for m in msgs)
    assert any("resuming from" in m and "checkpoint-2" in m for m in msgs)
    a, b = load_file(str(ref / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-5, atol=1e-6, msg=n)


RECIPE_CFG = dict(
    coco_steps=2,
    finetune_steps=2,
    refreshes=0,
    corpus_pool=None,
    wise_alpha=0.5,
    coco={"per_device_train_batch_size": 8, "save_steps": 2},
    finetune={"per_device_train_batch_size": 8, "num_clusters": 3, "save_steps": 2},
)


def test_the_recipe_reruns_exactly_the_stages_whose_inputs_changed(tiny_bert_dir, tiny_beir, tmp_path, caplog):
    from hf_cocodr.recipe import run_recipe

    out = tmp_path / "run"

    def run(cfg):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hf_cocodr"):
            run_recipe(str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
        return {
            m.split()[1].rstrip(":")
            for m in (r.getMessage() for r in caplog.records)
            if m.startswith("stage ") and "already finished" in m
        }

    assert run(RECIPE_CFG) == set()
    assert run(RECIPE_CFG) == {"coco", "finetune", "wise"}
    changed = {**RECIPE_CFG, "wise_alpha": 0.25}
    assert run(changed) == {"coco", "finetune"}
    assert json.loads((out / "wise" / "hf_cocodr_stage.json").read_text())["alpha"] == 0.25
    changed["finetune"] = {**RECIPE_CFG["finetune"], "learning_rate": 1e-3}
    assert run(changed) == {"coco"}
    assert run(changed) == {"coco", "finetune", "wise"}


def test_debug_shows_the_traceback_of_an_input_error(tmp_path, capsys):
    from hf_cocodr.cli import main

    argv = ["export", str(tmp_path / "missing-model"), str(tmp_path / "out")]
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError):
        main(["--debug", *argv])  # (-q would leave the hf_cocodr logger at WARNING for later tests)
