"""A data input is fingerprinted by what the loader reads of it (issue 52, item 3): a BEIR folder by its corpus file,
its queries file and its qrels, however many other files lie beside them, never by a run's output folder inside it;
a corpus given as a dataset by its contents. A changed input runs again what read it; an unchanged one is reused."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

from hf_cocodr.recipe import STAGES, Stage, run_recipe
from hf_cocodr.recipe.outputs import export_final
from hf_cocodr.rundir.run_record import fingerprint

ONLY_TOY = dict(skip_coco=True, skip_finetune=True, wise_alpha=None, save_hybrid=False)


class ReadsTargets(Stage):
    """A stage that reads the target corpora: its identity holds their fingerprint, as COCO's and the others' do."""

    name = "reader"

    def __init__(self):
        self.calls = 0

    def cost(self, throughput, cfg, **kw):
        return replace(super().cost(throughput, cfg, **kw), steps=2)

    def identity(self, run, start):
        return {**super().identity(run, start), "targets": run.fps["targets"]}

    def train(self, run):
        self.calls += 1
        export_final(Path(run.current), run.dir(self.name))
        return {"steps": 2}


def _write_beir(folder: Path, docs: dict[str, str], split: str = "heldout", n_queries: int = 6) -> Path:
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    ids = sorted(docs)
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as f:
        for doc_id in ids:
            f.write(json.dumps({"_id": doc_id, "title": "", "text": docs[doc_id]}) + "\n")
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as f:
        for i in range(n_queries):
            f.write(json.dumps({"_id": f"k{i}", "text": docs[ids[i % len(ids)]].split(" ", 2)[-1]}) + "\n")
    with open(folder / "qrels" / f"{split}.tsv", "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for i in range(n_queries):
            f.write(f"k{i}\t{ids[i % len(ids)]}\t1\n")
    return folder


def _docs(n: int, word: str) -> dict[str, str]:
    return {f"p{i:03d}": f"{word} page {i} on harbour cranes and tide {i % 4}" for i in range(n)}


def _scans(folder: Path, n: int = 640) -> None:
    """``n`` small files whose paths sort before ``corpus.jsonl`` (``appendix/...``)."""
    (folder / "appendix").mkdir()
    for i in range(n):
        (folder / "appendix" / f"scan-{i:04d}.txt").write_text(f"scan {i}")


def test_a_rewritten_corpus_behind_hundreds_of_small_files_changes_the_fingerprint(tmp_path):
    data = _write_beir(tmp_path / "harbour", _docs(10, "steel"))
    _scans(data)
    before = fingerprint(str(data))
    _write_beir(data, _docs(10, "brass"))  # the same sizes, other words
    assert fingerprint(str(data)) != before


def test_a_stage_reading_a_rewritten_corpus_runs_again(tiny_st_dir, tiny_beir, tmp_path):
    target = _write_beir(tmp_path / "harbour", _docs(30, "steel"))
    _scans(target)
    out, reader = tmp_path / "OUT", ReadsTargets()
    args = (str(tiny_st_dir), [str(target)], str(tiny_beir), out)
    run_recipe(*args, config=ONLY_TOY, stages=(*STAGES, reader))
    assert reader.calls == 1
    _write_beir(target, _docs(30, "timber"))
    run_recipe(*args, config=ONLY_TOY, stages=(*STAGES, reader))
    assert reader.calls == 2  # its input changed: not skipped as finished


def test_an_identical_rerun_with_its_output_inside_the_corpus_folder_is_skipped(
    tiny_st_dir, tiny_beir, tmp_path, caplog
):
    target = _write_beir(tmp_path / "harbour", _docs(30, "steel"))
    out, reader = target / "adapted", ReadsTargets()
    args = (str(tiny_st_dir), [str(target)], str(tiny_beir), out)
    run_recipe(*args, config=ONLY_TOY, stages=(*STAGES, reader))
    with caplog.at_level(logging.INFO, logger="hf_cocodr"):
        run_recipe(*args, config=ONLY_TOY, stages=(*STAGES, reader))
    assert reader.calls == 1
    assert any("stage reader: already finished" in r.getMessage() for r in caplog.records)


def test_a_corpus_given_as_a_dataset_is_fingerprinted_by_its_contents(tiny_st_dir, tiny_beir, tmp_path):
    import datasets

    def corpus(word: str):
        docs = _docs(30, word)
        return datasets.Dataset.from_dict({"_id": list(docs), "title": [""] * len(docs), "text": list(docs.values())})

    out, reader = tmp_path / "OUT", ReadsTargets()
    run_recipe(str(tiny_st_dir), [corpus("steel")], str(tiny_beir), out, config=ONLY_TOY, stages=(*STAGES, reader))
    run_recipe(str(tiny_st_dir), [corpus("timber")], str(tiny_beir), out, config=ONLY_TOY, stages=(*STAGES, reader))
    assert reader.calls == 2  # another corpus of the same size and columns is another input


def test_the_start_evaluation_follows_a_corpus_rewritten_behind_many_files(tiny_st_dir, tmp_path):
    from hf_cocodr.recipe.runner import _run_start_eval

    data = _write_beir(tmp_path / "evalset", _docs(12, "steel"))
    _scans(data)
    out = tmp_path / "OUT"
    out.mkdir()
    spec = f"{data}:heldout"
    assert _run_start_eval(str(tiny_st_dir), [spec], out, 16)[spec]["num_docs"] == 12
    _write_beir(data, _docs(20, "steel"))  # eight more documents
    assert _run_start_eval(str(tiny_st_dir), [spec], out, 16)[spec]["num_docs"] == 20


def test_the_start_evaluation_is_reused_when_only_files_beside_the_split_change(tiny_st_dir, tmp_path, monkeypatch):
    import hf_cocodr.recipe.runner as runner

    data = _write_beir(tmp_path / "evalset", _docs(12, "steel"))
    out = tmp_path / "OUT"
    out.mkdir()
    spec = f"{data}:heldout"
    first = runner._run_start_eval(str(tiny_st_dir), [spec], out, 16)[spec]
    (data / "notes.md").write_text("who labelled what")
    (data / "qrels" / "other.tsv").write_text("query-id\tcorpus-id\tscore\nk0\tp001\t1\n")  # another split
    (data / "adapted").mkdir()
    (data / "adapted" / "hf_cocodr_run.json").write_text("{}")  # a run's output folder inside the data folder
    (data / "adapted" / "eval.json").write_text("{}")

    def evaluated_again(*a, **k):
        raise AssertionError("the starting model was evaluated again")

    monkeypatch.setattr(runner, "evaluate_retrieval", evaluated_again)
    assert runner._run_start_eval(str(tiny_st_dir), [spec], out, 16)[spec] == first
