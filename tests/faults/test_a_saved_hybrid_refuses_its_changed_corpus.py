"""``HybridRetriever.load(folder)`` refuses a saved retriever whose corpus has changed since it was built, as the
README says, without being given the corpus: the corpus file it was read from is recorded (``corpus_file``: path,
size, modification time) and, where it still lies and looks changed, its ids and texts are fingerprinted again
(issue 66, item 8)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from hf_cocodr import HybridRetriever
from hf_cocodr.errors import ConfigError


@pytest.fixture
def saved(tiny_st_dir, tiny_beir, tmp_path):
    corpus = tmp_path / "handbook"
    shutil.copytree(tiny_beir, corpus)
    folder = tmp_path / "handbook-hybrid"
    HybridRetriever.build(str(tiny_st_dir), corpus, fusion={"dense_weight": 0.4}).save(folder)
    return corpus, folder


def test_a_rewritten_document_is_refused_at_load_in_one_line(saved):
    corpus, folder = saved
    file = corpus / "corpus.jsonl"
    docs = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    docs[len(docs) // 2]["text"] = "a paragraph rewritten after the index was built"
    file.write_text("".join(json.dumps(d) + "\n" for d in docs))
    with pytest.raises(ConfigError) as e:
        HybridRetriever.load(folder)
    message = str(e.value)
    assert "\n" not in message and str(file) in message and "has changed since" in message


def test_an_untouched_touched_or_moved_corpus_loads(saved):
    corpus, folder = saved
    assert len(HybridRetriever.load(folder).doc_ids) > 0  # unchanged
    file = corpus / "corpus.jsonl"
    st = file.stat()
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched, the same content: read once, accepted
    assert HybridRetriever.load(folder).doc_ids
    shutil.move(corpus, corpus.with_name("handbook-archived"))  # no longer where it was: nothing to compare with
    assert HybridRetriever.load(folder).doc_ids
