from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_cocodr.data import BEIRFormatError, load_beir


def write_beir(root: Path, corpus_lines, query_lines, qrels: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "qrels").mkdir(exist_ok=True)

    def dump(lines):
        return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)

    (root / "corpus.jsonl").write_text(dump(corpus_lines))
    (root / "queries.jsonl").write_text(dump(query_lines))
    for split, text in (qrels or {"test": "query-id\tcorpus-id\tscore\nq1\td1\t1\n"}).items():
        (root / "qrels" / f"{split}.tsv").write_text(text)
    return root


GOOD_DOCS = [{"_id": "d1", "title": "T1", "text": "alpha"}, {"_id": "d2", "title": "", "text": "beta"}]
GOOD_QUERIES = [{"_id": "q1", "text": "alpha?"}, {"_id": "q2", "text": "beta?"}]


def test_loads_valid_folder(tmp_path):
    folder = write_beir(
        tmp_path / "ok", GOOD_DOCS, GOOD_QUERIES, {"test": "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t2\n"}
    )
    corpus, queries, qrels = load_beir(folder, "test")
    assert list(corpus["_id"]) == ["d1", "d2"]
    assert list(queries["_id"]) == ["q1", "q2"]
    assert qrels == {"q1": {"d1": 1}, "q2": {"d2": 2}}
    # Arrow-backed, memory-mapped: the dataset is file-backed, not an in-memory Python structure.
    assert corpus.cache_files, "corpus should be backed by an Arrow file"


def test_queries_restricted_to_split(tmp_path):
    folder = write_beir(tmp_path / "ok", GOOD_DOCS, GOOD_QUERIES)
    data = load_beir(folder, "test")
    assert list(data.queries["_id"]) == ["q1"]
    assert len(load_beir(folder, "test", keep_all_queries=True).queries) == 2


@pytest.mark.parametrize(
    "corpus_lines, needle, line",
    [
        ([json.dumps(GOOD_DOCS[0]), '{"_id": "d2", "text": "unterminated'], "malformed JSON", 2),
        ([GOOD_DOCS[0], {"_id": "d2", "title": "x"}], "missing required field 'text'", 2),
        ([{"id": "d1", "text": "a"}], "missing required field '_id' (found ['id']", 1),
        ([GOOD_DOCS[0], GOOD_DOCS[1], {"_id": "d1", "text": "again"}], "duplicate _id 'd1' (first seen on line 1)", 3),
        (["[1, 2]"], "expected a JSON object", 1),
        ([{"_id": "", "text": "a"}], "'_id' must be a non-empty string", 1),
    ],
)
def test_corpus_errors_name_file_and_line(tmp_path, corpus_lines, needle, line):
    folder = write_beir(tmp_path / "bad", corpus_lines, GOOD_QUERIES)
    with pytest.raises(BEIRFormatError) as e:
        load_beir(folder, "test")
    msg = str(e.value)
    assert needle in msg
    assert f"corpus.jsonl, line {line}" in msg
    assert e.value.line == line


def test_query_error_names_queries_file(tmp_path):
    folder = write_beir(tmp_path / "bad", GOOD_DOCS, [GOOD_QUERIES[0], "{not json"])
    with pytest.raises(BEIRFormatError, match=r"queries.jsonl, line 2: malformed JSON"):
        load_beir(folder, "test")


def test_non_utf8_bytes(tmp_path):
    folder = write_beir(tmp_path / "bad", GOOD_DOCS, GOOD_QUERIES)
    with open(folder / "corpus.jsonl", "ab") as f:
        f.write(b'{"_id": "d3", "text": "caf\xe9"}\n')
    with pytest.raises(BEIRFormatError, match=r"corpus.jsonl, line 3: not valid UTF-8"):
        load_beir(folder, "test")


def test_empty_corpus(tmp_path):
    folder = write_beir(tmp_path / "bad", [], GOOD_QUERIES)
    with pytest.raises(BEIRFormatError, match=r"corpus.jsonl: the corpus file is empty"):
        load_beir(folder, "test")


def test_all_documents_empty_text(tmp_path):
    folder = write_beir(tmp_path / "bad", [{"_id": "d1", "text": " "}], GOOD_QUERIES)
    with pytest.raises(BEIRFormatError, match="every document has empty text"):
        load_beir(folder, None)


@pytest.mark.parametrize(
    "qrels_text, needle, line",
    [
        ("query-id\tcorpus-id\tscore\nq1\td1\t1\nq9\td1\t1\n", "query-id 'q9' is not in", 3),
        ("query-id\tcorpus-id\tscore\nq1\td404\t1\n", "corpus-id 'd404' is not in", 2),
        ("query-id\tcorpus-id\tscore\nq1\td1\n", "expected 3 tab-separated fields", 2),
        ("query-id\tcorpus-id\tscore\nq1\td1\tyes\n", "score 'yes' is not a number", 2),
    ],
)
def test_qrels_errors(tmp_path, qrels_text, needle, line):
    folder = write_beir(tmp_path / "bad", GOOD_DOCS, GOOD_QUERIES, {"test": qrels_text})
    with pytest.raises(BEIRFormatError) as e:
        load_beir(folder, "test")
    assert needle in str(e.value)
    assert f"test.tsv, line {line}" in str(e.value)


def test_missing_split_lists_available(tmp_path):
    folder = write_beir(
        tmp_path / "ok", GOOD_DOCS, GOOD_QUERIES, {"train": "q\td\ts\nq1\td1\t1\n", "dev": "q\td\ts\nq2\td2\t1\n"}
    )
    with pytest.raises(BEIRFormatError, match=r"split 'test' not found; available splits: \['dev', 'train'\]"):
        load_beir(folder, "test")


def test_missing_folder(tmp_path):
    with pytest.raises(BEIRFormatError, match="BEIR folder not found"):
        load_beir(tmp_path / "nope", "test")


def test_empty_documents_left_out_and_logged(tmp_path, caplog):
    docs = GOOD_DOCS + [{"_id": "d3", "title": "", "text": ""}, {"_id": "d4", "title": " ", "text": "\n"}]
    folder = write_beir(tmp_path / "ok", docs, GOOD_QUERIES)
    with caplog.at_level("INFO", logger="hf_cocodr"):
        data = load_beir(folder, "test")
    assert list(data.corpus["_id"]) == ["d1", "d2"]
    assert data.num_empty_docs == 2
    assert any("2 documents with empty title and text" in r.getMessage() for r in caplog.records)


def test_cache_invalidated_when_file_changes(tmp_path):
    folder = write_beir(tmp_path / "ok", GOOD_DOCS, GOOD_QUERIES)
    assert len(load_beir(folder, "test").corpus) == 2
    import os
    import time

    with open(folder / "corpus.jsonl", "a") as f:
        f.write(json.dumps({"_id": "d3", "text": "gamma"}) + "\n")
    st = (folder / "corpus.jsonl").stat()
    os.utime(folder / "corpus.jsonl", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    time.sleep(0.01)
    assert len(load_beir(folder, "test").corpus) == 3


def test_real_scifact_loads(shared_data):
    data = load_beir(shared_data / "scifact", "train")
    assert len(data.corpus) == 5183
    assert len(data.queries) == 809
    assert sum(len(v) for v in data.qrels.values()) == 919
