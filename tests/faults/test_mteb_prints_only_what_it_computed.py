"""``mteb`` never prints a result this run did not compute (issue 52, item 2): a results file left in the output
folder by another model, other data or the other system (dense / hybrid) under the same name and revision is computed
again, never printed as this run's; a task whose results this same model and data already computed is reported as
skipped, without scores. The expected scores are ``evaluate``'s on the same model and data, never hard-coded."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

import hf_cocodr.cli.mteb  # noqa: F401  (registers the mteb command)
from hf_cocodr import evaluate_retrieval, load_encoder
from hf_cocodr.cli import main

REVISION = "rc-5"
TASK = "sx-dev"


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    import tiny

    root = tmp_path_factory.mktemp("two_models")
    out = []
    for seed in (21, 22):
        bert = tiny.make_tiny_bert(root / f"bert{seed}", seed=seed, initializer_range=0.2)
        dense = root / f"dense{seed}"
        load_encoder(str(bert)).save(str(dense))
        out.append(dense)
    return out


def _score(model, data, hybrid=False) -> float:
    res = evaluate_retrieval(load_encoder(model), data, "dev", show_progress_bar=False, batch_size=16, hybrid=hybrid)
    return res["ndcg@10"]


def _mteb(model, data, out, name="lab-x/dense-sx", *extra) -> tuple[int, dict]:
    argv = ["-q", "mteb", str(model), str(data), "--split", "dev", "--task-name", TASK, "--model-name", name]
    argv += ["--revision", REVISION, "--output-folder", str(out), "--batch-size", "16", *extra]
    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        code = main(argv)
    lines = stdout.getvalue().strip().splitlines()
    return code, json.loads(lines[-1]) if code == 0 else {}


def _file_score(out, name="lab-x/dense-sx") -> float:
    path = Path(out) / "results" / name.replace("/", "__") / REVISION / f"{TASK}.json"
    return json.loads(path.read_text())["scores"]["dev"][0]["main_score"]


def test_another_model_under_the_same_name_and_revision_is_evaluated(two_models, tiny_beir, tmp_path):
    first, second = two_models
    s1, s2 = _score(first, tiny_beir), _score(second, tiny_beir)
    assert abs(s1 - s2) > 1e-3  # the two models rank differently: a reused score would show
    out = tmp_path / "board"
    code, line = _mteb(first, tiny_beir, out)
    assert code == 0 and line["tasks"][TASK]["main_score"] == pytest.approx(s1, abs=1e-4)
    code, line = _mteb(second, tiny_beir, out)
    assert code == 0
    assert line["tasks"][TASK]["main_score"] == pytest.approx(s2, abs=1e-4)
    assert _file_score(out) == pytest.approx(s2, abs=1e-4)


def test_a_result_is_kept_for_the_model_that_computed_it_not_for_the_folders_last_run(two_models, tiny_beir, tmp_path):
    """The last run's record alone cannot tell: another model ran last under another name."""
    first, second = two_models
    out = tmp_path / "board"
    assert _mteb(first, tiny_beir, out, "lab-x/one")[0] == 0
    assert _mteb(second, tiny_beir, out, "lab-x/two")[0] == 0
    code, line = _mteb(second, tiny_beir, out, "lab-x/one")  # the model of the folder's last run, another's file
    assert code == 0
    assert line["tasks"][TASK]["main_score"] == pytest.approx(_score(second, tiny_beir), abs=1e-4)


def test_changed_data_under_the_same_task_name_is_evaluated(two_models, tiny_beir, tmp_path):
    first, _ = two_models
    data = tmp_path / "sx"
    shutil.copytree(tiny_beir, data)
    out = tmp_path / "board"
    assert _mteb(first, data, out)[0] == 0
    before = _score(first, data)
    qrels = data / "qrels" / "dev.tsv"
    rows = qrels.read_text().splitlines()
    header, body = rows[0], rows[1:]
    # every query now judges the next query's document relevant: the same queries, other answers
    docs = [r.split("\t")[1] for r in body]
    moved = [f"{r.split(chr(9))[0]}\t{docs[(i + 1) % len(docs)]}\t1" for i, r in enumerate(body)]
    qrels.write_text("\n".join([header, *moved]) + "\n")
    after = _score(first, data)
    assert abs(after - before) > 1e-3
    code, line = _mteb(first, data, out)
    assert code == 0
    assert line["tasks"][TASK]["main_score"] == pytest.approx(after, abs=1e-4)
    assert _file_score(out) == pytest.approx(after, abs=1e-4)


def test_the_hybrid_after_the_dense_model_under_one_name_is_evaluated(two_models, tiny_beir, tmp_path):
    first, _ = two_models
    dense, hybrid = _score(first, tiny_beir), _score(first, tiny_beir, hybrid=True)
    assert abs(dense - hybrid) > 1e-3
    out = tmp_path / "board"
    assert _mteb(first, tiny_beir, out)[0] == 0
    code, line = _mteb(first, tiny_beir, out, "lab-x/dense-sx", "--hybrid")
    assert code == 0
    assert line["tasks"][TASK]["main_score"] == pytest.approx(hybrid, abs=1e-4)


def test_the_same_model_and_data_again_is_reported_skipped_without_a_score(two_models, tiny_beir, tmp_path):
    first, _ = two_models
    out = tmp_path / "board"
    assert _mteb(first, tiny_beir, out)[0] == 0
    path = out / "results" / "lab-x__dense-sx" / REVISION / f"{TASK}.json"
    written = path.read_bytes()
    code, line = _mteb(first, tiny_beir, out)
    assert code == 0
    entry = line["tasks"][TASK]
    assert entry.get("skipped") and "main_score" not in entry and entry["file"] == str(path)
    assert path.read_bytes() == written  # nothing was computed, nothing rewritten
    # --overwrite computes it again, and says so
    code, line = _mteb(first, tiny_beir, out, "lab-x/dense-sx", "--overwrite")
    assert code == 0 and "skipped" not in line["tasks"][TASK]
    assert line["tasks"][TASK]["main_score"] == pytest.approx(_score(first, tiny_beir), abs=1e-4)
