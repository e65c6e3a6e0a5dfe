"""--overwrite_output_dir writes beside a user's files, never over them or through their links (issue 30, data loss)."""

from __future__ import annotations

import hashlib

from hf_cocodr.cli import main
from hf_cocodr.rundir.run_record import LOCK, RECORD, TRAINER_ENTRIES


def _digest(folder):
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def _finetune(model, data, out, *extra):
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


def test_a_users_readme_and_a_link_named_like_a_model_file_are_refused_even_with_overwrite(
    tiny_st_dir, tiny_beir, tmp_path, capsys
):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere.json"
    out.mkdir()
    (out / "README.md").write_text("# my notes")
    elsewhere.write_text('{"precious": 1}')
    (out / "config.json").symlink_to(elsewhere)
    before = _digest(tmp_path)
    for argv in (
        _finetune(tiny_st_dir, tiny_beir, out, "--overwrite_output_dir"),
        [
            "pretrain",
            "--model",
            str(tiny_st_dir),
            "--corpus",
            str(tiny_beir),
            "--output_dir",
            str(out),
            "--max_steps",
            "1",
            "--use_cpu",
            "--overwrite_output_dir",
        ],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "README.md" in err and "config.json" in err and "would write" in err
    assert _digest(tmp_path) == before and (out / "config.json").is_symlink()


def test_a_recipe_refuses_a_users_eval_json_even_with_overwrite(tiny_bert_dir, tiny_beir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "eval.json").write_text('{"my": "results"}')
    argv = [
        "recipe",
        "--model",
        str(tiny_bert_dir),
        "--target-corpus",
        str(tiny_beir),
        "--source-data",
        str(tiny_beir),
        "--output_dir",
        str(out),
        "--overwrite_output_dir",
    ]
    assert main(argv) == 2
    assert "eval.json" in capsys.readouterr().err
    assert (out / "eval.json").read_text() == '{"my": "results"}' and sorted(p.name for p in out.iterdir()) == [
        "eval.json"
    ]


def test_every_entry_a_finetune_writes_is_named_in_the_list_the_refusal_checks(tiny_st_dir, tiny_beir, tmp_path):
    """The refusal is only as good as TRAINER_ENTRIES: a fresh finetune writes nothing outside it (besides its
    checkpoints and its own record)."""
    out = tmp_path / "fresh"
    assert main(_finetune(tiny_st_dir, tiny_beir, out)) == 0
    written = {p.name for p in out.iterdir()} - {RECORD, LOCK}
    assert written and not {n for n in written if n not in TRAINER_ENTRIES and not n.startswith("checkpoint-")}


def test_pretrain_with_overwrite_writes_the_model_beside_a_users_file(tiny_st_dir, tiny_beir, tmp_path, capsys):
    """A user's file whose name pretrain does not write: the run trains, exports beside it and leaves it as it was
    (before, the final export refused the folder after the training had run)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = ["pretrain", "--model", str(tiny_st_dir), "--corpus", str(tiny_beir), "--output_dir", str(out)]
    argv += ["--max_steps", "1", "--per_device_train_batch_size", "8", "--use_cpu", "--overwrite_output_dir"]
    assert main(argv) == 0, capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "modules.json").is_file() and (out / "model.safetensors").is_file()
