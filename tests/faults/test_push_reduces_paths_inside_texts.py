"""``push`` reduces a local path wherever it occurs in an uploaded text, not only where it is a whole JSON string:
a ``file://`` address, a path inside a sentence of a JSON value, and the card's own text (issue 66, item 8)."""

from __future__ import annotations

import json
import shutil

from helpers import push_capturing


def test_paths_inside_sentences_and_file_addresses_are_reduced_on_push(tiny_st_dir, tmp_path, monkeypatch):
    model = tmp_path / "to publish"
    shutil.copytree(tiny_st_dir, model)
    private = tmp_path / "private corpora"
    (private / "tenders").mkdir(parents=True)
    provenance = json.loads((model / "hf_cocodr_provenance.json").read_text())
    provenance["notes"] = [
        f"distilled on {(private / 'tenders' / 'corpus.jsonl').as_uri()} overnight",
        "queries read from /mnt/share/acme-logs/week7:dev, then filtered",
    ]
    (model / "hf_cocodr_provenance.json").write_text(json.dumps(provenance))
    card = (model / "README.md").read_text()
    card += (
        "\n\nAdapted on `/mnt/share/acme-logs/tenders/corpus.jsonl` (see file:///mnt/share/acme-logs/README.txt);"
        " the base is https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2 and/or org/name.\n"
    )
    (model / "README.md").write_text(card)

    uploaded = push_capturing(model, monkeypatch, "acme/tenders-retriever", "hf_" + "k" * 30)
    texts = {name: uploaded[name].decode("utf-8") for name in ("hf_cocodr_provenance.json", "README.md")}
    for name, text in texts.items():
        assert "/mnt/share" not in text and str(tmp_path) not in text and "file://" not in text, name
    notes = json.loads(texts["hf_cocodr_provenance.json"])["notes"]
    assert notes == ["distilled on corpus.jsonl overnight", "queries read from week7:dev, then filtered"]
    assert "Adapted on `corpus.jsonl` (see README.txt);" in texts["README.md"]
    assert "https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2 and/or org/name." in texts["README.md"]
