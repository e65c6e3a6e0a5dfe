"""The hybrid retriever's faults are one line with the path and the cause (issue 52, item 6): a write that fails
without an errno (numpy's short write on a full disk), a corpus with no word BM25 can index, and a hand-edited
``hybrid.json`` whose fields have the wrong type (checked before any model loads)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from hf_cocodr.cli import main
from hf_cocodr.errors import ConfigError
from hf_cocodr.retrieval.hybrid import HYBRID_FILE, HybridRetriever


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any weights load (transformers' from_pretrained, which every model load goes through) fails the test."""
    from transformers import PreTrainedModel

    def boom(cls, *a, **k):
        raise AssertionError(f"a model was loaded ({cls.__name__}) before hybrid.json was checked")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(boom))


@pytest.fixture(scope="module")
def saved(tiny_st_dir, tiny_beir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("faults") / "toy-index"
    HybridRetriever.build(str(tiny_st_dir), tiny_beir, fusion={"dense_weight": 0.6}).save(folder)
    return folder


def _through_the_cli(monkeypatch, work) -> int:
    """Run ``work()`` as the body of a CLI command: its exit status."""
    import hf_cocodr.cli as cli

    def run(args, rest):
        work()
        return 0

    monkeypatch.setitem(cli.COMMANDS, "bm25", cli.Command("bm25", "", cli.COMMANDS["bm25"].add_args, run))
    return main(["bm25", "unused", "--split", "dev"])


def test_a_short_write_without_errno_names_the_folder_and_the_likely_cause(
    saved, tiny_st_dir, tmp_path, capsys, monkeypatch
):
    hybrid = HybridRetriever.load(saved)
    out = tmp_path / "copy of the index"

    def short_write(file, arr, *a, **k):  # what numpy's tofile raises when the disk fills: no errno, no file name
        raise OSError(f"{arr.nbytes} requested and 512 written")

    monkeypatch.setattr(np, "save", short_write)
    rc = _through_the_cli(monkeypatch, lambda: hybrid.save(out))
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-cocodr")]
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith(f"hf-cocodr bm25: error: {out}: write failed (disk full?)"), err
    assert not out.exists()  # nothing half-written is left under the name


def test_a_corpus_with_no_indexable_word_says_so(tiny_st_dir, tmp_path, capsys, monkeypatch):
    folder = tmp_path / "only-stopwords"
    (folder / "qrels").mkdir(parents=True)
    docs = ["The, and of it.", "--- !!! ???", "", "It is, as it was: to be or not to be."]
    with open(folder / "corpus.jsonl", "w") as f:
        for i, text in enumerate(docs):
            f.write(json.dumps({"_id": f"s{i}", "title": "", "text": text}) + "\n")
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "a", "text": "anything"}) + "\n")
    (folder / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\na\ts1\t1\n")
    assert main(["bm25", str(folder), "--split", "dev"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-cocodr")]
    assert len(err) == 1 and "no indexable word" in err[0] and str(folder) in err[0], err
    # the hybrid says so too, before it encodes a document
    import hf_cocodr.retrieval.encoding as encoding

    def no_encoding(*a, **k):
        raise AssertionError("the corpus was encoded before BM25 found nothing to index")

    monkeypatch.setattr(encoding, "build_index", no_encoding)
    with pytest.raises(ConfigError, match="no indexable word") as e:
        HybridRetriever.build(str(tiny_st_dir), folder, fusion={"dense_weight": 0.5})
    assert str(folder) in str(e.value)


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("num_docs", "80", "a whole number"),
        ("num_docs", True, "a whole number"),
        ("model", ["a", "list"], "a string"),
        ("model_fingerprint", 7, "a string"),
        ("empty_rows", "none", "a list"),
        ("empty_rows", [2, 999], "a list"),
        ("bm25", {"k1": "1.5", "b": 0.75, "language": "english", "num_docs": 80}, "k1"),
        ("fusion", {"rule": "convex", "dense_weight": 0.6, "depth": "200"}, "depth"),
        ("fusion", {"dense_weight": 0.6, "colour": "blue"}, "colour"),
        ("doc_max_length", "64", "a whole number"),
        ("model_relative_to_folder", "yes", "true or false"),
        ("format_version", "1", "a whole number"),
    ],
)
def test_hand_edited_fields_of_the_wrong_type_are_named_before_any_model_loads(
    saved, tmp_path, field, value, expected, no_model_loads
):
    edited = tmp_path / "edited"
    shutil.copytree(saved, edited)
    info = json.loads((edited / HYBRID_FILE).read_text())
    info[field] = value
    (edited / HYBRID_FILE).write_text(json.dumps(info))
    with pytest.raises(ConfigError) as e:
        HybridRetriever.load(edited)
    msg = str(e.value)
    assert str(edited / HYBRID_FILE) in msg and field in msg and expected in msg, msg
    assert "\n" not in msg
