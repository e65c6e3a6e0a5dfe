"""Corpora as users hold them: gzipped BEIR files read transparently; wrong text types and lone surrogates refused
naming the file and the line, in every loader (BEIR folders and plain JSONL corpora for COCO)."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from hf_cocodr.data.beir import load_beir
from hf_cocodr.errors import BEIRFormatError


def test_a_gzipped_beir_folder_loads_as_the_plain_one(tiny_beir, tmp_path):
    packed = tmp_path / "packed"
    shutil.copytree(tiny_beir, packed)
    for name in ("corpus.jsonl", "queries.jsonl"):
        with open(packed / name, "rb") as src, gzip.open(packed / f"{name}.gz", "wb") as dst:
            dst.write(src.read())
        (packed / name).unlink()
    plain, gz = load_beir(tiny_beir, "dev"), load_beir(packed, "dev")
    assert gz.corpus["_id"] == plain.corpus["_id"] and gz.corpus["text"] == plain.corpus["text"]
    assert gz.queries["text"] == plain.queries["text"] and gz.qrels == plain.qrels


@pytest.mark.parametrize(
    "record, words",
    [
        ({"_id": "d2", "text": 12345}, "'text' must be a string, got int"),
        ({"_id": "d2", "title": ["a"], "text": "x"}, "'title' must be a string, got list"),
    ],
)
def test_a_beir_corpus_with_a_wrong_text_type_names_file_and_line(tiny_beir, tmp_path, record, words):
    folder = tmp_path / "bad"
    shutil.copytree(tiny_beir, folder)
    lines = (folder / "corpus.jsonl").read_text().splitlines()
    lines[1] = json.dumps(record)
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(BEIRFormatError, match=f"corpus.jsonl, line 2: {words}"):
        load_beir(folder, "dev")


def test_a_lone_surrogate_names_file_and_line(tiny_beir, tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(tiny_beir, folder)
    lines = (folder / "corpus.jsonl").read_text().splitlines()
    lines[2] = '{"_id": "d2", "title": "", "text": "broken \\ud800 text"}'
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(BEIRFormatError, match="corpus.jsonl, line 3: 'text' holds a lone surrogate"):
        load_beir(folder, "dev")


def test_a_plain_jsonl_corpus_for_coco_names_file_and_line_and_reads_gzip(tmp_path):
    from hf_cocodr.data.spans import jsonl_title_text

    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": {"nested": 1}}) + "\n")
    with pytest.raises(BEIRFormatError, match="docs.jsonl, line 2: 'text' must be a string, got dict"):
        list(jsonl_title_text(docs))
    packed = tmp_path / "docs.jsonl.gz"
    with gzip.open(packed, "wt") as f:
        f.write(json.dumps({"title": "T", "text": "body"}) + "\n")
    assert list(jsonl_title_text(packed)) == [("T", "body")]


def test_qrels_that_judge_nothing_relevant_are_named_in_a_warning(tiny_st_dir, tiny_beir, tmp_path, capsys):
    from hf_cocodr.cli import main

    data = tmp_path / "zero"
    shutil.copytree(tiny_beir, data)
    qrels = data / "qrels" / "dev.tsv"
    header, *rows = qrels.read_text().splitlines()
    qrels.write_text("\n".join([header] + ["\t".join(r.split("\t")[:2] + ["0"]) for r in rows]) + "\n")
    assert main(["evaluate", str(tiny_st_dir), str(data), "--split", "dev"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1])["ndcg@10"] == 0.0
    assert f"{qrels}: every judgement has grade 0" in captured.err
    # judged relevant somewhere: no warning
    assert main(["evaluate", str(tiny_st_dir), str(tiny_beir), "--split", "dev"]) == 0
    assert "every judgement has grade 0" not in capsys.readouterr().err


@pytest.mark.parametrize("command", ["evaluate", "finetune", "pretrain"])
def test_a_datasets_folder_is_refused_with_the_way_to_convert_it_before_any_model_loads(
    command, tiny_st_dir, tmp_path, capsys, monkeypatch
):
    import datasets

    import hf_cocodr.modeling.loading as loading
    from hf_cocodr.cli import main

    def no_model_load(*a, **k):
        raise AssertionError("a model was loaded before the data was checked")

    monkeypatch.setattr(loading, "load_encoder", no_model_load)
    folder = tmp_path / "saved"
    datasets.Dataset.from_dict({"_id": ["d1"], "title": [""], "text": ["a document"]}).save_to_disk(str(folder))
    args = {
        "evaluate": ["evaluate", str(tiny_st_dir), str(folder), "--split", "test"],
        "finetune": ["finetune", "--model", str(tiny_st_dir), "--train-data", str(folder)],
        "pretrain": ["pretrain", "--model", str(tiny_st_dir), "--corpus", str(folder)],
    }[command]
    if command != "evaluate":
        args += ["--output_dir", str(tmp_path / "out")]
    capsys.readouterr()  # datasets' own progress bar
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a `datasets` folder" in err[0] and "to_json" in err[0] and str(folder) in err[0]
