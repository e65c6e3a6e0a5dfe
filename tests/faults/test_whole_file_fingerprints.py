"""Fingerprints of whole files (issue 66, item 2): every "same inputs" decision and every cache keyed by a file rests
on the hash of all its bytes, so a file rewritten in its middle at the same size, with its modification time put
back, is another input: the run identities' fingerprints, the starting model's evaluation, the BEIR cache. A file's
hash is memoized by its path, inode, size and times (the change time included, which no user sets back)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hf_cocodr.rundir import file_hash
from hf_cocodr.rundir.run_record import fingerprint

pytestmark = pytest.mark.usefixtures("own_cache")


def _rewrite_in_place(path: Path, offset: int, data: bytes) -> None:
    """``data`` written over ``path`` at ``offset``, its size and modification time kept."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def _weights_folder(root: Path, mib: int = 5) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "bert"}')
    (root / "model.safetensors").write_bytes(bytes(range(256)) * (mib << 12))
    return root


def test_a_model_whose_middle_bytes_changed_in_place_is_another_input(tmp_path):
    model = _weights_folder(tmp_path / "encoder-v7")
    before = fingerprint(str(model))
    _rewrite_in_place(model / "model.safetensors", (5 << 20) // 2 + 4097, b"\x7f" * 640)
    assert fingerprint(str(model)) != before


def _beir(folder: Path, n_docs: int, word: str) -> Path:
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i in range(n_docs):
            f.write(json.dumps({"_id": f"r{i:05d}", "title": "", "text": f"{word} ledger entry {i:05d} of the quay"}))
            f.write("\n")
    (folder / "queries.jsonl").write_text('{"_id": "w1", "text": "ledger of the quay"}\n')
    (folder / "qrels" / "audit.tsv").write_text("query-id\tcorpus-id\tscore\nw1\tr00003\t1\n")
    return folder


def test_the_start_evaluation_follows_a_corpus_rewritten_in_its_middle(tmp_path, monkeypatch):
    import hf_cocodr.recipe.runner as runner

    data = _beir(tmp_path / "ledgers", 60_000, "brass")  # about 3 MiB: its middle is neither its first nor last MiB
    corpus = data / "corpus.jsonl"
    assert corpus.stat().st_size > 3 << 20
    calls = []

    def evaluated(model, folder, split, **kw):
        calls.append(split)
        channel = {"ndcg@10": 0.25, "recall@100": 0.5, "mrr@10": 0.2}
        return {
            **channel,
            "dense": {**channel, "num_queries": 1, "num_docs": 60_000},
            "bm25": channel,
            "fusion": {"rule": "test"},
        }

    monkeypatch.setattr(runner, "load_encoder", lambda model: None)
    monkeypatch.setattr(runner, "evaluate_retrieval", evaluated)
    out = tmp_path / "OUT"
    out.mkdir()
    spec = f"{data}:audit"
    runner._run_start_eval("some-org/encoder", [spec], out, 16)
    runner._run_start_eval("some-org/encoder", [spec], out, 16)
    assert len(calls) == 1  # unchanged: reused
    middle = corpus.read_bytes().index(b"brass ledger entry 30000")
    _rewrite_in_place(corpus, middle, b"steel")
    runner._run_start_eval("some-org/encoder", [spec], out, 16)
    assert len(calls) == 2  # the rewritten corpus is evaluated again


def test_the_beir_cache_reads_a_corpus_rewritten_at_the_same_size_and_time_again(tmp_path):
    from hf_cocodr.data.beir import load_corpus

    data = _beir(tmp_path / "ledgers", 40, "brass")
    assert load_corpus(data)["text"][7].startswith("brass")
    corpus = data / "corpus.jsonl"
    _rewrite_in_place(corpus, corpus.read_bytes().index(b"brass ledger entry 00007"), b"steel")
    assert load_corpus(data)["text"][7].startswith("steel")


def test_a_file_hash_is_memoized_until_the_file_changes_whatever_its_mtime(tmp_path, monkeypatch):
    monkeypatch.setattr(file_hash, "RACY_SECONDS", 0.0)
    monkeypatch.setattr(file_hash, "_memory", {})  # (this process's memo: the disk's is what a new command reads)
    hashed = []
    real = file_hash._hash
    monkeypatch.setattr(file_hash, "_hash", lambda p: hashed.append(p) or real(p))
    weights = _weights_folder(tmp_path / "encoder-v8", mib=2) / "model.safetensors"
    first = file_hash.file_sha256(weights)
    monkeypatch.setattr(file_hash, "_memory", {})  # a new process: the memo on disk
    assert file_hash.file_sha256(weights) == first
    assert len(hashed) == 1  # read from the memo, not hashed again
    time.sleep(0.05)  # (past the file system's clock tick: the change time moves)
    _rewrite_in_place(weights, 1 << 20, b"\x01\x02\x03")
    monkeypatch.setattr(file_hash, "_memory", {})
    assert file_hash.file_sha256(weights) != first
    assert len(hashed) == 2


def test_a_file_changed_just_before_it_is_hashed_is_not_memoized(tmp_path, monkeypatch):
    monkeypatch.setattr(file_hash, "_memory", {})
    weights = _weights_folder(tmp_path / "encoder-v9", mib=2) / "model.safetensors"
    file_hash.file_sha256(weights)  # written just now: within the racy window
    assert not (file_hash.cache_root() / file_hash.MEMO_KIND).exists() or not any(
        (file_hash.cache_root() / file_hash.MEMO_KIND).iterdir()
    )
    assert str(weights.resolve()) not in file_hash._memory
