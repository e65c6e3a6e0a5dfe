"""A path a saved retriever records as data is written as it is, even when a name in it has the shape of a Hub token
(issue 52, item 7): redacting it would leave the retriever unable to find its model. Secrets stay redacted."""

from __future__ import annotations

import json
import shutil

from hf_cocodr.retrieval.hybrid import HYBRID_FILE, HybridRetriever
from hf_cocodr.utils import REDACTED


def test_a_model_folder_named_like_a_token_is_recorded_and_found(tiny_st_dir, tiny_beir, tmp_path):
    token_like = "hf_" + "Qw3rTy" * 4  # the shape of a Hub token: hf_ and 24 letters and digits
    model = tmp_path / "zoo" / token_like
    shutil.copytree(tiny_st_dir, model)
    corpus = tmp_path / "corpora" / token_like
    shutil.copytree(tiny_beir, corpus)
    out = tmp_path / "served"
    hybrid = HybridRetriever.build(str(model), corpus, fusion={"dense_weight": 0.55})
    hybrid.meta["notes"] = {"hub_token": token_like}  # a secret beside the paths is still taken out
    hybrid.save(out)
    raw = (out / HYBRID_FILE).read_text()
    info = json.loads(raw)
    assert info["model"] == f"../zoo/{token_like}"
    assert info["corpus"] == str(corpus)
    assert info["notes"]["hub_token"] == REDACTED
    loaded = HybridRetriever.load(out)  # its model is found where it was recorded
    assert loaded.meta["model"] == str(model)
    ids, _ = loaded.search(["cells and genes"], k=2)
    assert len(ids[0]) == 2
