"""Faults of the machine end in one line naming the path and the cause, never a traceback, and lose nothing."""

from __future__ import annotations

import errno
import json

import pytest

from hf_cocodr.cli import main


def test_evaluate_prints_its_metrics_before_a_full_disk_refuses_the_output(
    tiny_st_dir, tiny_beir, tmp_path, capsys, monkeypatch
):
    import hf_cocodr.evaluation.retrieval as retrieval

    out = tmp_path / "result.json"

    def full_disk(path, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(retrieval, "write_result", full_disk)
    rc = main(["evaluate", str(tiny_st_dir), str(tiny_beir), "--split", "dev", "--output", str(out)])
    captured = capsys.readouterr()
    assert rc == 1
    assert "ndcg@10" in json.loads(captured.out.strip().splitlines()[-1])  # the metrics were printed first
    err = captured.err.strip().splitlines()
    assert err[-1] == f"hf-cocodr evaluate: error: {out}: the disk is full" and "Traceback" not in captured.err


def test_an_existing_file_that_is_not_a_result_is_never_replaced_by_output(tiny_st_dir, tiny_beir, tmp_path, capsys):
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}')
    rc = main(["evaluate", str(tiny_st_dir), str(tiny_beir), "--split", "dev", "--output", str(notes)])
    assert rc == 2 and "not a result file" in capsys.readouterr().err
    assert notes.read_text() == '{"mine": true}'
    # a result the command wrote before is replaced by the new one
    result = tmp_path / "result.json"
    assert main(["evaluate", str(tiny_st_dir), str(tiny_beir), "--split", "dev", "--output", str(result)]) == 0
    assert main(["evaluate", str(tiny_st_dir), str(tiny_beir), "--split", "dev", "--output", str(result)]) == 0
    assert "run" in json.loads(result.read_text())


@pytest.mark.parametrize(
    "fault, code, words",
    [
        (
            OSError(errno.EROFS, "Read-only file system", "/srv/out/model.safetensors"),
            1,
            "/srv/out/model.safetensors: the file system is read-only",
        ),
        (
            OSError(errno.EXDEV, "Invalid cross-device link", "/a/x", None, "/b/x"),
            1,
            "/a/x -> /b/x: source and destination are on different file systems",
        ),
        (KeyboardInterrupt(), 130, "interrupted"),
    ],
)
def test_machine_faults_and_ctrl_c_end_in_one_line(fault, code, words, capsys, monkeypatch):
    import hf_cocodr.cli as cli

    def raise_fault(args, rest):
        raise fault

    monkeypatch.setitem(cli.COMMANDS, "bm25", cli.Command("bm25", "", cli.COMMANDS["bm25"].add_args, raise_fault))
    assert main(["bm25", "somewhere", "--split", "dev"]) == code
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
