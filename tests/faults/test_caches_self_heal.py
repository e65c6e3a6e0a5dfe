"""The caches heal themselves: a damaged entry is rebuilt (with a warning naming it), a failed build leaves nothing,
a killed build's leftovers are swept, and a corpus that changed keeps one entry, not one per version."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiny

from hf_cocodr.data.spans import SpanCorpus


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_COCODR_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny.make_tokenizer(tmp_path_factory.mktemp("tok"))


def write_corpus(path: Path, n: int = 12, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"_id": f"d{i}", "title": "", "text": tiny.document(rng, "heart", 4)}) + "\n")
    return path


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def same_spans(a: SpanCorpus, b: SpanCorpus) -> None:
    for name in ("doc_span_ptr", "span_tok_ptr", "tokens", "doc_source"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert (a.sources, a.mode, a.stats) == (b.sources, b.mode, b.stats)


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_truncated_span_cache_is_rebuilt_with_a_warning_naming_it(cache, tokenizer, tmp_path):
    corpus = write_corpus(tmp_path / "docs.jsonl")
    uncached = SpanCorpus.build([corpus], tokenizer, cache=False)
    SpanCorpus.build([corpus], tokenizer)
    (npz,) = (cache / "spans").glob("*.npz")
    raw = npz.read_bytes()
    npz.write_bytes(raw[: len(raw) // 2])  # a kill or a full disk mid-write of an earlier version
    records = _Warnings()
    logging.getLogger("hf_cocodr.data.spans").addHandler(records)
    try:
        again = SpanCorpus.build([corpus], tokenizer)
    finally:
        logging.getLogger("hf_cocodr.data.spans").removeHandler(records)
    same_spans(again, uncached)
    assert len(records.messages) == 1 and str(npz.with_suffix(".json")) in records.messages[0], records.messages
    assert npz.read_bytes() != raw[: len(raw) // 2] and len(np.load(npz)["tokens"]) == len(uncached.tokens)
    same_spans(SpanCorpus.build([corpus], tokenizer), uncached)  # and the rebuilt entry loads


def test_pretrain_runs_on_a_damaged_span_cache(cache, tiny_bert_dir, tmp_path, capsys):
    from hf_cocodr.cli import main

    corpus = write_corpus(tmp_path / "docs.jsonl", n=16)
    args = [
        "pretrain",
        "--model",
        str(tiny_bert_dir),
        "--corpus",
        str(corpus),
        "--max_steps",
        "1",
        "--per_device_train_batch_size",
        "4",
        "--use_cpu",
        "--save_strategy",
        "no",
        "--report_to",
        "none",
    ]
    assert main([*args, "--output_dir", str(tmp_path / "a")]) == 0
    for p in (cache / "spans").glob("*.npz"):
        p.write_bytes(p.read_bytes()[:100])
    capsys.readouterr()
    assert main([*args, "--output_dir", str(tmp_path / "b")]) == 0, capsys.readouterr().err
    assert "is damaged" in capsys.readouterr().err


def test_a_failed_span_cache_write_leaves_nothing_and_the_next_build_works(cache, tokenizer, tmp_path, monkeypatch):
    import hf_cocodr.data.spans as spans

    corpus = write_corpus(tmp_path / "docs.jsonl")

    def full_disk(file, **arrays):
        f = file if hasattr(file, "write") else open(file, "wb")
        f.write(b"PK\x03\x04 half an archive")
        f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    real = spans.np.savez
    monkeypatch.setattr(spans.np, "savez", full_disk)
    with pytest.raises(OSError):
        SpanCorpus.build([corpus], tokenizer)
    assert sorted(p.name for p in (cache / "spans").iterdir()) == []
    monkeypatch.setattr(spans.np, "savez", real)
    same_spans(SpanCorpus.build([corpus], tokenizer), SpanCorpus.build([corpus], tokenizer, cache=False))


def test_a_killed_builds_leftover_is_swept_and_a_live_writers_is_kept(cache, tokenizer, tmp_path):
    corpus = write_corpus(tmp_path / "docs.jsonl")
    folder = cache / "spans"
    folder.mkdir(parents=True)
    host = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]  # staging names: .hf_cocodr-tmp-HOST-PID-...
    dead = folder / f".hf_cocodr-tmp-{host}-{dead_pid()}-0123abcd.spans-x-y.npz"
    live = folder / f".hf_cocodr-tmp-{host}-{os.getppid()}-0123abcd.spans-x-y.npz"
    for p in (dead, live):
        p.write_bytes(b"PK\x03\x04 left over")
    SpanCorpus.build([corpus], tokenizer)
    assert not dead.exists()
    assert live.exists()  # its writer (a live process) may still be writing it


def test_a_touched_corpus_keeps_one_span_cache_entry_and_one_beir_cache_file(cache, tokenizer, tmp_path):
    corpus = write_corpus(tmp_path / "docs.jsonl")
    beir = tiny.make_beir(tmp_path / "beir", n_docs=16, n_queries=4)
    other = write_corpus(tmp_path / "other.jsonl", seed=1)  # another corpus keeps its entry
    SpanCorpus.build([other], tokenizer)
    for round_ in range(3):
        for path in (corpus, beir / "corpus.jsonl"):
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9 * (round_ + 1)))  # touched, not changed
        SpanCorpus.build([corpus], tokenizer)
        SpanCorpus.build([beir], tokenizer)
    names = sorted(p.name for p in (cache / "spans").iterdir())
    assert len(names) == 6 and sum(n.endswith(".npz") for n in names) == 3, names  # corpus, beir, other
    assert len(list((cache / "beir").glob("corpus-*.arrow"))) == 1
    same_spans(SpanCorpus.build([corpus], tokenizer), SpanCorpus.build([corpus], tokenizer, cache=False))
