"""--target-queries DIR:SPLIT / DIR / FILE, the labels never read, and no training on the evaluation's queries."""

from __future__ import annotations

import json
import shutil

import pytest

from hf_cocodr.data.target_queries import read_target_queries, refuse_eval_overlap
from hf_cocodr.errors import ConfigError


def _split_qids(folder, split):
    lines = (folder / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]
    return list(dict.fromkeys(line.split("\t")[0] for line in lines if line.strip()))


def test_dir_split_reads_the_judged_query_ids_and_never_the_labels(tiny_beir, tmp_path):
    folder = tmp_path / "b"
    shutil.copytree(tiny_beir, folder)
    qids = _split_qids(folder, "train")
    # the labels of the split are garbage that any qrels parser would refuse: only the id column may be read
    (folder / "qrels" / "train.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t<no such doc>\tnot-a-grade\n" for q in qids)
    )
    src = read_target_queries(f"{folder}:train")
    texts = {json.loads(line)["_id"]: json.loads(line)["text"] for line in open(folder / "queries.jsonl")}
    assert src.ids == qids and src.texts == [texts[q] for q in qids] and src.name == "b:train"
    assert len(read_target_queries(folder).texts) == len(texts)  # the folder: all its queries


def test_a_jsonl_log_and_bad_sources(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text('{"text": "first query"}\n\n{"text": "  "}\n{"text": "second"}\n')
    assert read_target_queries(log).texts == ["first query", "second"]
    with pytest.raises(ConfigError, match="no such BEIR folder"):
        read_target_queries(tmp_path / "missing")
    with pytest.raises(ConfigError, match="not found"):
        read_target_queries(f"{tmp_path}:train")


def test_target_queries_shared_with_an_eval_split_are_refused_by_name(tiny_beir, tmp_path):
    refuse_eval_overlap([f"{tiny_beir}:train"], [f"{tiny_beir}:dev"])  # disjoint splits: fine
    with pytest.raises(ConfigError, match=r"shares \d+ queries with the --eval split .*:dev \(e.g. query 'q"):
        refuse_eval_overlap([f"{tiny_beir}:dev"], [f"{tiny_beir}:dev"])
    dev_text = read_target_queries(f"{tiny_beir}:dev").texts[0]
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"text": "  " + dev_text.upper() + " "}) + "\n")
    with pytest.raises(ConfigError, match="holds a query of the --eval split"):
        refuse_eval_overlap([log], [f"{tiny_beir}:dev"])


def test_the_recipe_refuses_the_overlap_before_any_work(tiny_bert_dir, tiny_beir, tmp_path, capsys):
    from hf_cocodr.cli import main

    out = tmp_path / "out"
    rc = main(
        [
            "recipe",
            "--model",
            str(tiny_bert_dir),
            "--target-corpus",
            str(tiny_beir),
            "--source-data",
            str(tiny_beir),
            "--output_dir",
            str(out),
            "--eval",
            f"{tiny_beir}:dev",
            "--method",
            "modir",
            "--target-queries",
            f"{tiny_beir}:dev",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and ":dev" in err[0] and "query 'q" in err[0]
    assert not out.exists()
