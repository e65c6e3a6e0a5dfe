"""Hub datasets and ``datasets`` objects wherever a BEIR folder is taken: local folders laid out exactly as the Hub
repositories (the mteb layout, ``mteb/<name>``; the BEIR layout, ``BeIR/<name>`` + ``BeIR/<name>-qrels``; parquet
files per config) read through the same ``datasets.load_dataset`` call as a Hub id, scoring as the BEIR folder does,
with one-line errors naming repository, config and row, and fingerprints that follow the data."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiny
from helpers import run_cli

from hf_cocodr import HybridRetriever, evaluate_bm25, evaluate_retrieval, load_beir
from hf_cocodr.data.sources import SOURCE_FILE, data_label, resolve_data
from hf_cocodr.rundir.run_record import data_fingerprint


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """The toy BEIR folder and its two Hub layouts."""
    root = tmp_path_factory.mktemp("hub")
    folder = tiny.make_beir(root / "beir" / "toy")
    mteb, beir = tiny.hub_layouts(folder, root)
    return folder, mteb, beir


def _scores(result):
    return {k: result[k] for k in ("ndcg@10", "recall@100", "mrr@10", "num_queries", "num_docs")}


def test_both_layouts_read_as_the_beir_folder(layouts):
    """The corpus, queries and qrels of each layout are the BEIR folder's, row for row, and the cached folder says
    what it was read from."""
    folder, mteb, beir = layouts
    expected = load_beir(folder, "dev")
    for source in (mteb, beir):
        data = load_beir(source, "dev")
        assert data.qrels == expected.qrels
        assert data.corpus["_id"] == expected.corpus["_id"] and data.corpus["text"] == expected.corpus["text"]
        assert data.queries["_id"] == expected.queries["_id"] and data.queries["text"] == expected.queries["text"]
        record = json.loads((data.folder / SOURCE_FILE).read_text())
        assert record["source"] == str(source) and data_label(data.folder) == str(source)
    assert json.loads((load_beir(mteb, "dev").folder / SOURCE_FILE).read_text())["layout"] == "mteb"
    assert json.loads((load_beir(beir, "dev").folder / SOURCE_FILE).read_text())["layout"] == "beir"
    assert sorted(p.stem for p in (resolve_data(str(beir)) / "qrels").glob("*.tsv")) == ["dev", "train"]


def test_evaluate_bm25_and_the_hybrid_score_as_from_the_beir_folder(layouts, tiny_st_dir, capsys):
    """``evaluate_retrieval`` (dense and hybrid), ``evaluate_bm25``, ``HybridRetriever.build`` and the CLI's
    ``evaluate`` give the BEIR folder's scores from either layout and from a ``DatasetDict``."""
    import datasets

    from hf_cocodr.cli import main

    folder, mteb, beir = layouts
    data = load_beir(folder, "dev")
    qrels = [{"query-id": q, "corpus-id": d, "score": s} for q, docs in data.qrels.items() for d, s in docs.items()]
    as_dict = datasets.DatasetDict(
        corpus=data.corpus.select_columns(["_id", "title", "text"]),
        queries=load_beir(folder, None).queries.select_columns(["_id", "text"]),
        dev=datasets.Dataset.from_list(qrels),
    )
    dense = _scores(evaluate_retrieval(str(tiny_st_dir), folder, "dev", show_progress_bar=False))
    hybrid = _scores(evaluate_retrieval(str(tiny_st_dir), folder, "dev", show_progress_bar=False, hybrid=True))
    bm25 = _scores(evaluate_bm25(folder, "dev"))
    built = HybridRetriever.build(str(tiny_st_dir), folder)
    queries = ["alpha beta kernel", "gradient descent study"]
    ranking = built.search(queries, k=5)
    for source in (mteb, beir, as_dict):
        assert _scores(evaluate_retrieval(str(tiny_st_dir), source, "dev", show_progress_bar=False)) == dense
        assert _scores(evaluate_retrieval(str(tiny_st_dir), source, "dev", hybrid=True)) == hybrid
        assert _scores(evaluate_bm25(source, "dev")) == bm25
        other = HybridRetriever.build(str(tiny_st_dir), source)
        ids, scores = other.search(queries, k=5)
        assert ids == ranking[0] and scores == ranking[1]
    for source in (mteb, beir):
        assert main(["evaluate", str(tiny_st_dir), str(source), "--split", "dev"]) == 0
        line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert {k: line[k] for k in dense} == dense
        assert main(["bm25", str(source), "--split", "dev"]) == 0
        line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert line["ndcg@10"] == bm25["ndcg@10"]


def _copy(src, dst):
    shutil.copytree(src, dst)
    qrels = src.with_name(src.name + "-qrels")
    if qrels.is_dir():
        shutil.copytree(qrels, dst.with_name(dst.name + "-qrels"))
    return dst


def test_bad_layouts_are_one_line_each_naming_repo_config_and_row(layouts, tmp_path, capsys, tiny_st_dir):
    """A config the layout needs and the repository lacks, a split it does not have, a corpus row without ``_id``:
    one line each, before the model loads (the model given here does not exist)."""
    _, mteb, _ = layouts
    missing_model = str(tmp_path / "no-model")
    renamed = _copy(mteb, tmp_path / "renamed" / "toy")
    card = (renamed / "README.md").read_text().replace("config_name: queries", "config_name: questions")
    (renamed / "README.md").write_text(card)
    line = run_cli(["evaluate", missing_model, renamed, "--split", "dev"], capsys)
    assert "no 'queries' config" in line and str(renamed) in line and "'questions'" in line
    line = run_cli(["evaluate", missing_model, mteb, "--split", "test"], capsys)
    assert f"{mteb} (its qrels): split 'test' not found" in line and "['dev', 'train']" in line
    line = run_cli(["recipe", "--model", tiny_st_dir, "--target-corpus", mteb, "--eval", f"{mteb}:test",
                    "--output_dir", tmp_path / "out"], capsys)  # fmt: skip
    assert f"split 'test' not found in {mteb} (its qrels)" in line
    bad = _copy(mteb, tmp_path / "bad" / "toy")
    part = bad / "corpus" / "test-00000-of-00001.parquet"
    rows = pq.read_table(part).to_pylist()
    rows[3]["_id"] = None
    pq.write_table(pa.Table.from_pylist(rows), part)
    line = run_cli(["evaluate", missing_model, bad, "--split", "dev"], capsys)
    assert f"{bad} (config 'corpus', split 'test'): row 3: '_id' must be a non-empty string" in line


def test_offline_and_not_cached_is_one_line_before_the_model_loads(tmp_path, capsys):
    line = run_cli(["evaluate", tmp_path / "no-model", "nobody-here/no-such-set", "--split", "test"], capsys)
    assert "nobody-here/no-such-set" in line and "not in the datasets cache" in line and "HF_HUB_OFFLINE=1" in line
    line = run_cli(["bm25", "nobody-here/no-such-set@v2"], capsys)
    assert "the Hub dataset nobody-here/no-such-set is not in the datasets cache" in line


def test_changed_data_is_another_folder_with_another_fingerprint(layouts, tmp_path):
    """A local Hub-layout folder whose file changes (the datasets cache keys such a folder by its file patterns, not
    their contents) is read again: a new cached folder, a new data fingerprint, the new text."""
    _, mteb, _ = layouts
    copy = _copy(mteb, tmp_path / "changing" / "toy")
    before = resolve_data(str(copy))
    fp = data_fingerprint(before, "dev")
    assert resolve_data(str(copy)) == before  # unchanged: the same folder
    part = copy / "corpus" / "test-00000-of-00001.parquet"
    rows = pq.read_table(part).to_pylist()
    rows[0]["text"] = "an entirely new text"
    pq.write_table(pa.Table.from_pylist(rows), part)
    after = resolve_data(str(copy))
    assert after != before and data_fingerprint(after, "dev") != fp
    assert load_beir(copy, "dev").corpus[0]["text"] == "an entirely new text"
    assert (
        json.loads((after / SOURCE_FILE).read_text())["local_files"]
        != json.loads((before / SOURCE_FILE).read_text())["local_files"]
    )
