"""Round three of "nothing lost, nothing wrong, nothing leaked" (issue 40): one test or more per numbered cause, each
with another path, command or spelling than the issue's example.

1 paths that resolve elsewhere, 2 folders replaced whole, 3 a run that reads what it writes, 4 caches trusted after
their inputs changed, 5 private paths uploaded, 6 names near the length limit, 7 hostile YAML, 8 checks after the
expensive work, 9 the overlap guard, 10 nonsense in search, 11 a saved retriever that cannot move.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import push_capturing

from hf_cocodr.cli import main
from hf_cocodr.errors import ConfigError
from hf_cocodr.retrieval.hybrid import HybridRetriever

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any weights load (transformers' from_pretrained, which every model load goes through) fails the test."""
    from transformers import PreTrainedModel

    def boom(cls, *a, **k):
        raise AssertionError(f"a model was loaded ({cls.__name__}) before the input was checked")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(boom))


def _one_line_error(capsys, command: str) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert err[0].startswith(f"hf-cocodr {command}: error: "), err[0]
    return err[0]


def _write_beir(folder: Path, docs: dict[str, str], queries: dict[str, str], qrels: dict[str, list[str]]) -> Path:
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as f:
        for doc_id, text in docs.items():
            f.write(json.dumps({"_id": doc_id, "title": "", "text": text}) + "\n")
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as f:
        for qid, text in queries.items():
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    for split, qids in qrels.items():
        with open(folder / "qrels" / f"{split}.tsv", "w") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for qid in qids:
                f.write(f"{qid}\td0\t1\n")
    return folder


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def hybrid(tiny_st_dir, tiny_beir):
    return HybridRetriever.build(str(tiny_st_dir), str(tiny_beir), batch_size=16)


# ---------------------------------------------------------------------------------------- 1. paths resolving elsewhere
def test_a_save_path_that_climbs_back_into_a_users_folder_is_refused_and_the_folder_kept(hybrid, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("three years of work")
    before = _files(mine)
    with pytest.raises(FileExistsError, match="not a saved hybrid retriever"):
        hybrid.save(str(mine / "fresh" / "deeper" / ".." / ".."))  # lands on mine itself
    assert _files(mine) == before


def test_a_target_corpus_spelled_with_dotdot_names_its_own_retriever_folder(hybrid, tiny_beir, tmp_path):
    """`--target-corpus toy/qrels/..` is the folder toy: its retriever is OUT/hybrid/toy, never OUT itself."""
    from hf_cocodr.recipe.runner import _save_hybrids

    out = tmp_path / "OUT"
    out.mkdir()
    (out / "keep.txt").write_text("the user's")
    run = SimpleNamespace(
        target_corpora=[str(tiny_beir / "qrels" / "..")],
        out=out,
        cfg=SimpleNamespace(eval_batch_size=16, target_queries=[]),
    )
    _save_hybrids(run, hybrid.model)
    assert (out / "hybrid" / tiny_beir.name / "hybrid.json").is_file()
    assert (out / "keep.txt").read_text() == "the user's"
    assert sorted(p.name for p in (out / "hybrid").iterdir()) == [tiny_beir.name]


# ---------------------------------------------------------------------------------------- 2. folders replaced whole
def test_saving_over_a_saved_retriever_keeps_the_users_entries_inside_it(hybrid, tmp_path):
    folder = tmp_path / "retriever"
    hybrid.save(folder)
    (folder / "NOTES.md").write_text("how I built it")
    (folder / "queries").mkdir()
    (folder / "queries" / "log.jsonl").write_text('{"text": "a query"}\n')
    hybrid.save(folder)
    assert (folder / "NOTES.md").read_text() == "how I built it"
    assert (folder / "queries" / "log.jsonl").read_text() == '{"text": "a query"}\n'
    assert HybridRetriever.load(folder, hybrid.model).doc_ids == hybrid.doc_ids


def test_a_second_export_of_the_recipe_model_keeps_the_users_file_in_it(tiny_st_dir, tmp_path):
    from hf_cocodr.recipe.outputs import export_final
    from hf_cocodr.utils import add_written_entries

    final = tmp_path / "OUT" / "model"
    export_final(Path(tiny_st_dir), final)
    add_written_entries(final, ["eval.json"])  # as the recipe does before it evaluates into the folder
    (final / "eval.json").write_text('{"old": 1}')
    (final / "serving.yaml").write_text("replicas: 2\n")
    export_final(Path(tiny_st_dir), final)  # a recipe re-run exports again
    assert (final / "serving.yaml").read_text() == "replicas: 2\n"
    assert (final / "model.safetensors").is_file()
    assert not (final / "eval.json").exists()  # the run's own evaluation is not the user's: replaced, not kept


# ---------------------------------------------------------------------------------------- 3. a run reads what it writes
def test_finetune_into_a_folder_inside_its_model_is_refused_before_any_model_loads(
    tiny_st_dir, tiny_beir, tmp_path, capsys, no_model_loads
):
    model = tmp_path / "base"
    shutil.copytree(tiny_st_dir, model)
    before = _files(model)
    argv = ["finetune", "--model", str(model), "--train-data", str(tiny_beir), "--num-clusters", "2"]
    argv += ["--output_dir", str(model / "adapted"), "--max_steps", "1", "--use_cpu"]
    assert main(argv) == 2
    line = _one_line_error(capsys, "finetune")
    assert "the model is read from" in line, line
    assert _files(model) == before and not (model / "adapted").exists()


# ---------------------------------------------------------------------------------------- 4. caches and their inputs
def test_the_starting_models_cached_evaluation_follows_a_changed_split(tiny_st_dir, tmp_path):
    from hf_cocodr.recipe.runner import _run_start_eval

    data = tmp_path / "evalset"
    docs = {f"d{i}": f"document number {i} about topic {i % 3}" for i in range(12)}
    queries = {f"q{i}": f"topic {i % 3} number {i}" for i in range(8)}
    _write_beir(data, docs, queries, {"heldout": list(queries)})
    out = tmp_path / "OUT"
    out.mkdir()
    spec = f"{data}:heldout"
    first = _run_start_eval(str(tiny_st_dir), [spec], out, 16)[spec]
    assert first["num_queries"] == 8
    _write_beir(data, docs, queries, {"heldout": ["q0", "q1", "q2"]})  # the split's judgements change
    second = _run_start_eval(str(tiny_st_dir), [spec], out, 16)[spec]
    assert second["num_queries"] == 3


def test_an_edited_id_list_or_a_cut_vector_file_is_refused_by_name_before_the_model_loads(
    hybrid, tmp_path, no_model_loads
):
    folder = tmp_path / "saved"
    hybrid.save(folder)
    ids = json.loads((folder / "doc_ids.json").read_text())
    ids[3] = "someone-else"
    (folder / "doc_ids.json").write_text(json.dumps(ids))
    with pytest.raises(ConfigError, match="doc_ids.json"):
        HybridRetriever.load(folder)
    hybrid.save(folder)
    raw = (folder / "dense_embeddings.npy").read_bytes()
    (folder / "dense_embeddings.npy").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ConfigError, match="dense_embeddings.npy"):
        HybridRetriever.load(folder)


def test_a_damaged_teacher_cache_entry_is_rebuilt_not_trusted(tiny_st_dir, tiny_beir, caplog):
    from hf_cocodr.retrieval.hybrid import _corpus_ids_texts
    from hf_cocodr.retrieval.teacher import teacher_cache_path, teacher_rankings

    queries = ["alpha beta gamma", "protein folding study"]
    first = teacher_rankings(str(tiny_st_dir), "tiny-key-r3", str(tiny_beir), queries, 4)
    assert first[4] is False  # built
    entry = teacher_cache_path("tiny-key-r3", *_corpus_ids_texts(str(tiny_beir)))
    ids = json.loads((entry / "doc_ids.json").read_text())
    ids[-1] = ids[0]  # an edited entry: one id written over another
    (entry / "doc_ids.json").write_text(json.dumps(ids))
    with caplog.at_level(logging.WARNING, logger="hf_cocodr"):
        again = teacher_rankings(str(tiny_st_dir), "tiny-key-r3", str(tiny_beir), queries, 4)
    assert again[:2] == first[:2]
    assert again[4] is False and "building it again" in caplog.text
    assert entry.exists()


# ---------------------------------------------------------------------------------------- 5. private paths uploaded
def test_push_uploads_no_relative_or_absolute_data_path_in_the_card_or_the_provenance(
    tiny_st_dir, tmp_path, monkeypatch
):
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.model_card import write_model_card

    model = tmp_path / "model"
    shutil.copytree(tiny_st_dir, model)
    row = {"ndcg@10": 0.5, "recall@100": 0.9}
    card = {
        "start_vs_adapted": {
            "clients/acme-corp/contracts:dev": {"adapted": row, "start": row},
            f"{tmp_path}/clients/acme-corp/leases:test": {"adapted": row, "start": row},
        },
        "stages": [
            {
                "type": "finetune",
                "title": "fine-tuning",
                "method": "idro",
                "corpora": ["clients/acme-corp/contracts"],
                "source_data": "clients/acme-corp/labelled",
                "target queries": ["clients/acme-corp/contracts:logs"],
            }
        ],
    }
    write_model_card(model, SentenceTransformer(str(model)), card)
    uploaded = push_capturing(model, monkeypatch, "acme/tiny", "hf_" + "x" * 30)
    readme = uploaded["README.md"].decode()
    provenance = uploaded["hf_cocodr_provenance.json"].decode()
    for text in (readme, provenance):
        assert "acme-corp" not in text and "clients/" not in text and str(tmp_path) not in text
    assert "contracts:dev" in readme and "leases:test" in readme
    assert "contracts:dev" in json.loads(provenance)["start_vs_adapted"]


# ---------------------------------------------------------------------------------------- 6. names near the length limit
def test_an_export_into_a_folder_named_near_the_length_limit_succeeds(tiny_st_dir, tmp_path, capsys):
    out = tmp_path / ("adapted-model-" + "x" * 230)  # 244 bytes: valid, and so is every file inside
    assert main(["export", str(tiny_st_dir), str(out)]) == 0, capsys.readouterr().err
    assert (out / "model.safetensors").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".hf_cocodr")]


def test_a_record_with_a_name_of_255_bytes_is_written_atomically(tmp_path):
    from hf_cocodr.utils import atomic_write_json

    path = tmp_path / ("é" * 125 + ".json")  # 255 bytes in UTF-8
    atomic_write_json(path, {"ok": True})
    assert json.loads(path.read_text()) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


# ---------------------------------------------------------------------------------------- 7. hostile YAML
# ten levels of ten references each (10**9 values once expanded), every anchor inside a known option
BOMB = "finetune:\n  lr_scheduler_kwargs:\n" + "\n".join(
    ["    l0: &l0 {a: 1, b: 1, c: 1, d: 1, e: 1, f: 1, g: 1, h: 1, i: 1, j: 1}"]
    + [f"    l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 10)}]" for n in range(1, 9)]
)


def test_an_alias_bomb_is_refused_in_seconds(tiny_st_dir, tiny_beir, tmp_path):
    """In a subprocess with a memory cap, so that a regression fails this test instead of the machine."""
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(BOMB + "\n")
    assert len(cfg.read_bytes()) < 1200
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))\n"
        "from hf_cocodr.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    argv = ["recipe", "--model", str(tiny_st_dir), "--target-corpus", str(tiny_beir), "--source-data"]
    argv += [str(tiny_beir), "--output_dir", str(tmp_path / "out"), "--config", str(cfg)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the alias bomb was not refused within 120 s")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "aliases" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 120
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "text,named",
    [
        ("0.5: half\nseed: 3\n", "0.5"),  # a number as a top-level key
        ("finetune:\n  ~: 3\n", "None"),  # null as a key inside a stage mapping
    ],
)
def test_a_key_that_is_not_a_name_is_one_line(text, named, tiny_st_dir, tiny_beir, tmp_path, capsys):
    cfg = tmp_path / "keys.yaml"
    cfg.write_text(text)
    argv = ["recipe", "--model", str(tiny_st_dir), "--target-corpus", str(tiny_beir), "--source-data"]
    argv += [str(tiny_beir), "--output_dir", str(tmp_path / "out"), "--config", str(cfg)]
    assert main(argv) == 2
    line = _one_line_error(capsys, "recipe")
    assert str(cfg) in line and named in line, line


def test_a_config_that_is_not_utf8_names_the_file_and_line(tiny_st_dir, tiny_beir, tmp_path, capsys):
    cfg = tmp_path / "latin1.yaml"
    cfg.write_bytes("seed: 3\nlearning_rate: 1e-5\n# réglages\n".encode("latin-1"))
    argv = ["finetune", "--model", str(tiny_st_dir), "--train-data", str(tiny_beir)]
    argv += ["--output_dir", str(tmp_path / "out"), "--config", str(cfg)]
    assert main(argv) == 2
    line = _one_line_error(capsys, "finetune")
    assert str(cfg) in line and "line 3" in line and "UTF-8" in line, line


def test_scheduler_options_the_scheduler_does_not_take_are_refused_before_any_model_loads(
    tiny_st_dir, tiny_beir, tmp_path, capsys, no_model_loads
):
    cfg = tmp_path / "sched.yaml"
    cfg.write_text("lr_scheduler_type: cosine\nlr_scheduler_kwargs:\n  num_cyclez: 2\n")
    argv = ["finetune", "--model", str(tiny_st_dir), "--train-data", str(tiny_beir), "--num-clusters", "2"]
    argv += ["--output_dir", str(tmp_path / "out"), "--max_steps", "1", "--use_cpu", "--config", str(cfg)]
    assert main(argv) == 2
    line = _one_line_error(capsys, "finetune")
    assert "lr_scheduler_kwargs" in line and "num_cyclez" in line, line
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------- 8. checks after the work
def _recipe(model, corpus, source, out, *extra):
    return ["recipe", "--model", str(model), "--target-corpus", str(corpus), "--source-data", str(source)] + [
        "--output_dir",
        str(out),
        *extra,
    ]


def test_a_missing_target_corpus_file_is_refused_before_the_folder_is_claimed(
    tiny_st_dir, tiny_beir, tmp_path, capsys, no_model_loads
):
    typo = tmp_path / "contracts" / "corpus.jsnol"
    assert main(_recipe(tiny_st_dir, typo, tiny_beir, tmp_path / "out")) == 2
    line = _one_line_error(capsys, "recipe")
    assert str(typo) in line, line
    assert not (tmp_path / "out").exists()


@pytest.fixture
def distill_case(tmp_path):
    """A target BEIR folder of 6 documents and its queries (plus a JSONL log of them), and an eval split apart."""
    docs = {f"d{i}": f"clause {i} of the lease about rent deposit number {i}" for i in range(6)}
    queries = {f"q{i}": f"rent deposit clause {i}" for i in range(6)}
    folder = _write_beir(tmp_path / "leases", docs, queries, {"unlabelled": list(queries)})
    return folder


@pytest.mark.parametrize(
    "case,expected",
    [
        ("blank", "no query with text"),
        ("small", "fewer than one distillation batch"),
        ("deep", "distill_k 12 is more than the 6 documents"),
        ("zero", "per_device_train_batch_size must be a whole number >= 1, got 0"),
    ],
)
def test_distillation_inputs_are_checked_before_any_model_loads(
    case, expected, distill_case, tiny_st_dir, tiny_beir, tmp_path, capsys, no_model_loads
):
    config = {"skip_distill": False, "skip_coco": True, "distill_k": 4, "distill": {"per_device_train_batch_size": 2}}
    queries = f"{distill_case}:unlabelled"
    if case == "blank":
        log = tmp_path / "log.jsonl"
        log.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("   ", "\u200b\u2060", "\t")))
        queries = str(log)
    elif case == "small":
        config["distill"] = {"per_device_train_batch_size": 8}
    elif case == "deep":
        config["distill_k"] = 12
    else:
        config["distill"] = {"per_device_train_batch_size": 0}
    cfg = tmp_path / "recipe.yaml"
    cfg.write_text(json.dumps(config))
    argv = _recipe(tiny_st_dir, distill_case, tiny_beir, tmp_path / "out", "--target-queries", queries)
    assert main([*argv, "--config", str(cfg)]) == 2
    line = _one_line_error(capsys, "recipe")
    assert expected in line, line
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------- 9. the overlap guard
def test_an_eval_query_with_invisible_characters_and_wide_letters_is_still_caught(tmp_path):
    from hf_cocodr.data.target_queries import refuse_eval_overlap

    evalset = _write_beir(
        tmp_path / "evalset",
        {"d0": "a document"},
        {"q0": "Ｗｈｏ\u2060 owns the\u00ad patent\u200d pool?", "q1": "another question"},
        {"test": ["q0", "q1"]},
    )
    log = tmp_path / "searches.jsonl"
    log.write_text(json.dumps({"text": "who owns the patent pool?"}) + "\n")
    with pytest.raises(ConfigError, match="holds a query of the --eval split"):
        refuse_eval_overlap([str(log)], [f"{evalset}:test"])


# ---------------------------------------------------------------------------------------- 10. nonsense in search
@pytest.mark.parametrize("k", [0, -1, 2.0, "3", True, None])
def test_search_refuses_a_k_that_is_not_a_count(k, hybrid):
    with pytest.raises(ConfigError, match="k must be a whole number >= 1"):
        hybrid.search(["protein folding"], k=k)


def test_search_takes_a_numpy_count(hybrid):
    ids, _ = hybrid.search(["protein folding"], k=np.int64(3))
    assert len(ids[0]) == 3


def test_blank_queries_get_no_results_and_a_count(hybrid, caplog):
    with caplog.at_level(logging.WARNING, logger="hf_cocodr"):
        ids, scores = hybrid.search(["protein folding", "", " \n\t"], k=5)
    assert len(ids[0]) == 5 and ids[1:] == [[], []] and scores[1:] == [[], []]
    assert "2 of 3 queries are empty or blank" in caplog.text


def test_documents_without_text_are_never_returned(tiny_st_dir, tmp_path):
    docs = {"d0": "", "d1": "solar panel efficiency", "d2": "   ", "d3": "wind turbine blades", "d4": "tidal power"}
    folder = _write_beir(tmp_path / "energy", docs, {"q0": "x"}, {"test": ["q0"]})
    hybrid = HybridRetriever.build(str(tiny_st_dir), str(folder))
    ids, _ = hybrid.search(["zzzz qqqq", "solar"], k=5)  # the first matches no word of any document
    for row in ids:
        assert set(row) <= {"d1", "d3", "d4"} and row
    folder2 = tmp_path / "saved"
    hybrid.save(folder2)
    again, _ = HybridRetriever.load(folder2, hybrid.model).search(["zzzz qqqq"], k=5)
    assert set(again[0]) <= {"d1", "d3", "d4"}


def test_repeated_target_queries_are_kept_once_with_a_count(tmp_path, caplog):
    from hf_cocodr.data.target_queries import read_target_queries

    log = tmp_path / "log.jsonl"
    texts = ["Late Fee Policy", "late fee policy", "late  fee\u200b policy", "deposit refund", "LATE FEE POLICY"]
    log.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    with caplog.at_level(logging.WARNING, logger="hf_cocodr"):
        got = read_target_queries(str(log))
    assert got.texts == ["Late Fee Policy", "deposit refund"]
    assert "3 of 5 queries repeat" in caplog.text


# ---------------------------------------------------------------------------------------- 11. a retriever that moves
def test_a_run_folder_copied_elsewhere_still_loads_its_retriever(tiny_st_dir, tiny_beir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_st_dir, tmp_path / "run" / "model")
    hybrid = HybridRetriever.build("run/model", str(tiny_beir))  # a path relative to the working folder
    hybrid.save("run/hybrid/toy")
    shutil.copytree(tmp_path / "run", tmp_path / "archive" / "run-1", symlinks=True)
    shutil.rmtree(tmp_path / "run")
    moved = HybridRetriever.load(tmp_path / "archive" / "run-1" / "hybrid" / "toy")
    assert moved.search(["protein folding"], k=3) == hybrid.search(["protein folding"], k=3)


def test_a_missing_model_is_named_with_the_way_out(tiny_st_dir, tiny_beir, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(tiny_st_dir, model)
    HybridRetriever.build(str(model), str(tiny_beir)).save(tmp_path / "r")
    shutil.rmtree(model)
    with pytest.raises(ConfigError, match=r"model="):
        HybridRetriever.load(tmp_path / "r")
