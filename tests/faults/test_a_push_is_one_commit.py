"""Every ``push`` is exactly one commit, whatever its file count (issue 66, item 9): huggingface_hub's
``upload_folder`` may split a large upload into several commits; hf_cocodr hands all operations to one
``create_commit``. Counted on the stand-in Hub."""

from __future__ import annotations

import json
import shutil

import hub_standin
import pytest


@pytest.fixture(scope="module")
def hub():
    server, state, url = hub_standin.start()
    yield state, url
    server.shutdown()


def test_a_push_of_many_files_is_one_commit(hub, tiny_st_dir, tmp_path):
    state, url = hub
    model = tmp_path / "many results"
    shutil.copytree(tiny_st_dir, model)
    results = model / "mteb_results" / "results" / "acme__many" / "r1"
    results.mkdir(parents=True)
    for i in range(420):  # more files than one preupload batch or one upload_folder commit takes
        (results / f"Task{i:03d}.json").write_text(json.dumps({"task_name": f"Task{i:03d}", "scores": {}}))
    proc = hub_standin.cli(["push", str(model), "acme/many-files"], hub_standin.hub_env(url, tmp_path / "home"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    commits = [c for c in state.commits if c["repo"] == "acme/many-files"]
    assert len(commits) == 1
    assert sum(f.startswith("mteb_results/") for f in commits[0]["files"]) == 420
