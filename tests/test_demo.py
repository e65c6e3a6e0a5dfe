"""``scripts/tools/demo.py --smoke`` (the steps of ``make demo`` on the tiny model and corpus) writes its table, its
PNG (a valid image, one bar per system) and its record; a second run reuses its plan and the cached encodings."""

from __future__ import annotations

import json

import pytest
from helpers import load_demo

SYSTEMS = ["bm25", "start", "hybrid", "queries", "corpus"]


def test_the_smoke_demo_writes_its_table_and_picture(tiny_st_dir, numbered_beir, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    monkeypatch.setenv("HF_COCODR_CACHE", str(tmp_path / "cache"))
    demo, out = load_demo(), tmp_path / "demo"
    args = ["--smoke", "--model", str(tiny_st_dir), "--data", str(numbered_beir), "--source", str(numbered_beir)]
    assert demo.main([*args, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "1/3" in printed and "3/3" in printed and "| system | nDCG@10 |" in printed

    # the data split: odd ids evaluate, even ids are the query log, nothing in both; the corpus is a link
    data = out / "data" / numbered_beir.name
    assert (data / "corpus.jsonl").is_symlink()
    ids = {
        s: {r.split("\t")[0] for r in (data / "qrels" / f"{s}.tsv").read_text().splitlines()[1:]}
        for s in ("log", "dev")
    }
    assert ids["log"] and ids["dev"] and not ids["log"] & ids["dev"]
    assert all(int(q[1:]) % 2 == 1 for q in ids["dev"]) and all(int(q[1:]) % 2 == 0 for q in ids["log"])

    table = (out / "demo.md").read_text()
    record = json.loads((out / "demo.json").read_text())
    rows = {r["key"]: r for r in record["rows"]}
    assert list(rows) == SYSTEMS
    for key, row in rows.items():
        assert row["ndcg@10"] is not None and 0.0 <= row["ndcg@10"] <= 1.0, (key, row.get("note"))
        assert f"| {row['system']} | {row['ndcg@10']:.4f} |" in table
    assert rows["start"]["vs_start"] == 0.0
    assert record["runs"]["queries"]["steps"] == {"distill": 2}  # the query log distilled, fixed tiny steps

    picture = record["picture"]
    assert picture["png"] == str(out / "demo.png") and picture["systems"] == SYSTEMS and picture["bars"] == 5
    image = matplotlib.image.imread(out / "demo.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100

    # a second run: the same plan, the recipes' finished stages skipped, the start's vectors from the cache
    assert demo.main([*args, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "an earlier run's plan is in the output folder: reused" in printed
    assert "read from the cache" in printed and "its finished stages were skipped" in printed
    again = json.loads((out / "demo.json").read_text())
    assert [r["ndcg@10"] for r in again["rows"]] == pytest.approx([r["ndcg@10"] for r in record["rows"]], abs=1e-6)


def test_without_matplotlib_the_table_says_why_there_is_no_picture(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    rows = [{"key": "bm25", "system": "BM25", "ndcg@10": 0.5}]
    picture = load_demo().write_png(rows, tmp_path / "demo.png", "t")
    assert picture["png"] is None and "matplotlib is not installed" in picture["why"]
    assert not (tmp_path / "demo.png").exists()
