"""Push to a stand-in Hub on 127.0.0.1 and load back through it (subprocesses: HF_ENDPOINT is read at import)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import hub_standin
import pytest
from hub_standin import TOKEN, cli, hub_env


@pytest.fixture(scope="module")
def hub():
    server, state, url = hub_standin.start()
    yield state, url
    server.shutdown()


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def assert_no_token(*texts_or_dirs):
    for item in texts_or_dirs:
        if isinstance(item, Path):
            for p in item.rglob("*"):
                if p.is_file():
                    assert TOKEN.encode() not in p.read_bytes(), p
        else:
            assert TOKEN not in item


@pytest.fixture()
def model_dir(tiny_st_dir, tmp_path):
    import shutil

    d = tmp_path / "model"
    shutil.copytree(tiny_st_dir, d)
    (d / "condenser_head.safetensors").write_bytes(b"fake-head-bytes")
    (d / "condenser_head.json").write_text(json.dumps({"n_head_layers": 2}))
    (d / "eval.json").write_text(json.dumps({"scifact:train": {"ndcg@10": 0.5}}))
    (d / "mteb_results").mkdir()
    (d / "mteb_results" / "SciFact.json").write_text("{}")
    (d / "checkpoint-10").mkdir()
    (d / "checkpoint-10" / "optimizer.pt").write_bytes(b"x")
    return d


def test_push_and_reload_through_the_standin(hub, model_dir, tmp_path):
    state, url = hub
    env = hub_env(url, tmp_path / "home")
    before = tree_digest(model_dir)
    proc = cli(["push", str(model_dir), "acme/tiny-cocodr", "--commit-message", "first"], env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["repo_id"] == "acme/tiny-cocodr"
    commits = [c for c in state.commits if c["repo"] == "acme/tiny-cocodr"]
    assert len(commits) == 1 and commits[0]["summary"] == "first"  # one commit for everything
    files = set(commits[0]["files"])
    for f in (
        "model.safetensors",
        "modules.json",
        "README.md",
        "1_Pooling/config.json",
        "condenser_head.safetensors",
        "condenser_head.json",
        "mteb_results/SciFact.json",
        "config_sentence_transformers.json",
    ):
        assert f in files, f
    assert not any(f.startswith("checkpoint-") for f in files)
    assert "eval.json" not in files and "hf_cocodr_run.json" not in files  # local records (this machine's paths)
    assert any(TOKEN in h for h in state.auth_headers)  # the token was used...
    assert_no_token(proc.stdout, proc.stderr, model_dir)  # ...and never written or printed
    assert tree_digest(model_dir) == before
    # Load it back through the stand-in, in a fresh cache: CLS pooling, dot similarity, same embeddings.
    code = (
        "import json, sys; from sentence_transformers import SentenceTransformer;"
        "from hf_cocodr.modeling.loading import pooling_mode;"
        "remote = SentenceTransformer('acme/tiny-cocodr'); local = SentenceTransformer(sys.argv[1]);"
        "t = ['cardiac artery pulse', 'a melody on the piano'];"
        "a = remote.encode(t); b = local.encode(t);"
        "print(json.dumps({'pooling': pooling_mode(remote), 'sim': str(remote.similarity_fn_name),"
        " 'max_diff': float(abs(a - b).max())}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(model_dir)],
        env=hub_env(url, tmp_path / "home2"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res == {"pooling": "cls", "sim": "dot", "max_diff": 0.0}


def test_push_to_a_branch(hub, model_dir, tmp_path):
    state, url = hub
    proc = cli(
        ["push", str(model_dir), "acme/branchy", "--revision", "dev", "--private"], hub_env(url, tmp_path / "h")
    )
    assert proc.returncode == 0, proc.stderr
    assert state.repos["acme/branchy"]["private"] is True
    assert "model.safetensors" in state.repos["acme/branchy"]["branches"]["dev"]
    assert [c["revision"] for c in state.commits if c["repo"] == "acme/branchy"] == ["dev"]


def test_failed_push_is_one_clear_line_and_leaves_the_directory(hub, model_dir, tmp_path):
    state, url = hub
    before = tree_digest(model_dir)
    state.fail_commits = True
    try:
        proc = cli(["push", str(model_dir), "acme/failing"], hub_env(url, tmp_path / "h"))
    finally:
        state.fail_commits = False
    assert proc.returncode == 2
    err = [line for line in proc.stderr.splitlines() if "error:" in line]  # beside the log of what stays local
    assert len(err) == 1 and "failed (HTTP 500)" in err[0] and "nothing local was changed" in err[0], proc.stderr
    assert_no_token(proc.stderr)
    assert tree_digest(model_dir) == before


@pytest.mark.parametrize(
    "args, message",
    [
        (["push", "{model}", "no-slash"], "must look like 'org/name'"),
        (["push", "{model}", "acme/bad name!"], "is not valid"),
        (["push", "{missing}", "acme/x"], "not found"),
    ],
)
def test_push_bad_input(hub, model_dir, tmp_path, args, message):
    _, url = hub
    args = [a.format(model=model_dir, missing=tmp_path / "missing") for a in args]
    proc = cli(args, hub_env(url, tmp_path / "h"))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_trainers_push_to_hub(hub, tiny_bert_dir, tiny_beir, tmp_path):
    """push_to_hub=True in both trainers: one commit with the encoder, the card (and the head for COCO)."""
    state, url = hub
    env = hub_env(url, tmp_path / "h")
    common = ["--max_steps", "2", "--per_device_train_batch_size", "8", "--use_cpu", "--push_to_hub"]
    proc = cli(
        [
            "pretrain",
            "--model",
            str(tiny_bert_dir),
            "--corpus",
            str(tiny_beir),
            "--output_dir",
            str(tmp_path / "coco"),
            "--hub_model_id",
            "acme/coco-tiny",
            *common,
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    coco_files = {f for c in state.commits if c["repo"] == "acme/coco-tiny" for f in c["files"]}
    assert [c["repo"] for c in state.commits].count("acme/coco-tiny") == 1
    assert {"model.safetensors", "README.md", "condenser_head.safetensors", "condenser_head.json"} <= coco_files
    proc = cli(
        [
            "finetune",
            "--model",
            str(tmp_path / "coco"),
            "--train-data",
            str(tiny_beir),
            "--output_dir",
            str(tmp_path / "ft"),
            "--num-clusters",
            "2",
            "--hub_model_id",
            "acme/ft-tiny",
            "--eval",
            f"{tiny_beir}:dev",
            *common,
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ft = [c for c in state.commits if c["repo"] == "acme/ft-tiny"]
    assert len(ft) == 1 and {"model.safetensors", "README.md"} <= set(ft[0]["files"])
    assert not {"eval.json", "trainer_state.json", "hf_cocodr_run.json"} & set(ft[0]["files"])
    assert not any(f.startswith(("checkpoint-", "runs/")) for f in ft[0]["files"])
    card = state.repos["acme/ft-tiny"]["branches"]["main"]["README.md"].decode()
    assert "iDRO fine-tuning" in card and "COCO continuous contrastive pretraining" in card
    for repo in ("acme/coco-tiny", "acme/ft-tiny"):  # no local path went up
        for rel, data in state.repos[repo]["branches"]["main"].items():
            assert str(tiny_beir).encode() not in data and str(tmp_path).encode() not in data, (repo, rel)
    assert_no_token(proc.stdout, proc.stderr, tmp_path / "coco", tmp_path / "ft")


def test_push_requires_hub_model_id(tiny_st_dir, tiny_beir, tmp_path):
    from hf_cocodr import IDROTrainer, IDROTrainingArguments, RetrievalTrainingData, load_encoder

    args = IDROTrainingArguments(output_dir=str(tmp_path), push_to_hub=True, report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match="needs hub_model_id"):
        IDROTrainer(
            model=load_encoder(tiny_st_dir),
            args=args,
            train_dataset=RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="none"),
        )


def test_publish_script_offline(hub, tiny_bert_dir, tiny_beir, tmp_path):
    """convert + evaluate + MTEB files + push, on a small raw BERT made in the test."""
    state, url = hub
    script = Path(__file__).resolve().parent.parent / "scripts" / "tools" / "publish_cocodr.py"
    out = tmp_path / "pub"
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            "--src",
            str(tiny_bert_dir),
            "--out",
            str(out),
            "--repo-id",
            "acme/cocodr-pub",
            "--eval",
            f"{tiny_beir}:dev",
        ],
        env=hub_env(url, tmp_path / "h"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert f"{tiny_beir}:dev" in summary["evaluation"]
    files = set(state.repos["acme/cocodr-pub"]["branches"]["main"])
    assert {"model.safetensors", "README.md", "mteb_model_meta.json"} <= files and "eval.json" not in files
    for rel, data in state.repos["acme/cocodr-pub"]["branches"]["main"].items():  # no local path went up
        assert str(tiny_beir).encode() not in data and str(tmp_path).encode() not in data, rel
    assert any(f.startswith("mteb_results/results/acme__cocodr-pub/") and f.endswith("model_meta.json") for f in files)
    card = state.repos["acme/cocodr-pub"]["branches"]["main"]["README.md"].decode()
    task = f"{Path(tiny_beir).name}-dev".replace("_", "-")  # the local MTEB task the script ran
    mteb_rows = [line for line in card.splitlines() if line.startswith(f"| {task} (dev) | MTEB | ")]
    assert len(mteb_rows) == 1, card  # the card's results table shows the MTEB result, with its score
    assert re.match(r"\| [^|]+ \| MTEB \| \d\.\d+ \|", mteb_rows[0]), mteb_rows[0]
    assert_no_token(proc.stdout, proc.stderr, out)
