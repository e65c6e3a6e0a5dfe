"""The demo (``scripts/tools/demo.py``) claims its output folder like every command: ``--fresh`` deletes only what
an earlier demo wrote, a link where it writes (``OUTPUT/data`` pointing at a real dataset) is refused before anything
is written, and an evaluation split with no query is one line (issue 66, item 1)."""

from __future__ import annotations

import hashlib

import pytest
from helpers import load_demo


class Stop(BaseException):
    """Ends the demo where its work would start (after the output folder is claimed and cleared)."""


def stop_before_work(demo, monkeypatch) -> None:
    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(demo, "setup_logs", stop)


def args(numbered_beir, out, *extra) -> list[str]:
    return ["--smoke", "--data", str(numbered_beir), "--source", str(numbered_beir), "--output", str(out), *extra]


def test_fresh_deletes_what_the_demo_wrote_and_nothing_else(numbered_beir, tmp_path, monkeypatch):
    demo, out = load_demo(), tmp_path / "demo output"
    folder = demo.claim_output(out)  # an earlier demo's entries: its data split, a table
    data = demo.prepare_data(numbered_beir, out / "data")["folder"]
    (out / "demo.md").write_text("| system |")
    folder.release()
    (out / "my summary.txt").write_text("mine")  # the user's, beside and inside the demo's
    (data / "qrels" / "by hand.tsv").write_text("query-id\tcorpus-id\tscore\n")
    stop_before_work(demo, monkeypatch)
    with pytest.raises(Stop):
        demo.main(args(numbered_beir, out, "--fresh"))
    assert not (out / "demo.md").exists() and not (data / "qrels" / "dev.tsv").exists()
    assert not (data / "corpus.jsonl").is_symlink()
    assert (out / "my summary.txt").read_text() == "mine"
    assert (data / "qrels" / "by hand.tsv").is_file()
    assert (numbered_beir / "corpus.jsonl").is_file()  # the links' targets are untouched


def test_a_linked_data_folder_is_refused_before_anything_is_written(numbered_beir, tmp_path, monkeypatch, capsys):
    demo, out = load_demo(), tmp_path / "out"
    real = tmp_path / "a real dataset"
    (real / numbered_beir.name / "qrels").mkdir(parents=True)
    dev = real / numbered_beir.name / "qrels" / "dev.tsv"
    dev.write_text("query-id\tcorpus-id\tscore\nq7\td1\t2\n")
    before = hashlib.sha256(dev.read_bytes()).hexdigest()
    out.mkdir()
    (out / "data").symlink_to(real, target_is_directory=True)
    stop_before_work(demo, monkeypatch)
    assert demo.main(args(numbered_beir, out)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{out} holds data (a symbolic link to {real})" in err
    assert hashlib.sha256(dev.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in out.iterdir()) == ["data"]


def test_an_evaluation_split_without_a_query_is_one_line(numbered_beir, tmp_path, monkeypatch, capsys):
    demo, out = load_demo(), tmp_path / "out"
    train = numbered_beir / "qrels" / "train.tsv"
    lines = train.read_text().splitlines()
    train.write_text("\n".join([lines[0]] + [r for r in lines[1:] if int(r.split("\t")[0][1:]) % 2 == 0]) + "\n")
    stop_before_work(demo, monkeypatch)
    assert demo.main(args(numbered_beir, out)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(train) in err and "odd id" in err
    assert not out.exists()
