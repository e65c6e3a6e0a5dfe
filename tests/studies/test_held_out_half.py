"""The held-out half of a study pool (``scripts/studies/cpu_budget.py``'s ``half_pools``, issue 49): the pool is
split by query text, so a text repeated under several ids never lands on both sides."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path


def _cpu_budget():
    folder = Path(__file__).resolve().parents[2] / "scripts" / "studies"
    sys.path.insert(0, str(folder))  # (its sibling modules import each other by name)
    try:
        spec = importlib.util.spec_from_file_location("cpu_budget_under_test", folder / "cpu_budget.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(folder))
    return mod


def test_the_half_pool_splits_by_text_and_keeps_every_row_of_its_queries(tmp_path):
    study = _cpu_budget()
    texts = {f"q{i}": f"Query number {i % 12}" for i in range(30)}  # 12 texts, most under several ids
    texts["q29"] = "  QUERY number 3 "  # the same text as q3 once normalised (case and spacing)
    rows = [f"q{i}\td{i}-{j}\t1" for i in range(30) for j in range(2)]
    for name, _ in study.EVALS:
        folder = tmp_path / name
        (folder / "qrels").mkdir(parents=True)
        (folder / "queries.jsonl").write_text(
            "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in texts.items())
        )
        (folder / "qrels" / f"{study.POOL}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    study.half_pools(tmp_path)
    from hf_cocodr.data.target_queries import _norm

    for name, _ in study.EVALS:
        path = tmp_path / name / "qrels" / f"{study.HALF}.tsv"
        kept = path.read_text().splitlines()[1:]
        ids = {r.split("\t")[0] for r in kept}
        inside = {_norm(texts[q]) for q in ids}
        outside = {_norm(t) for q, t in texts.items() if q not in ids}
        assert inside and outside and not inside & outside  # both sides hold texts, and never the same one
        assert kept == [r for r in rows if r.split("\t")[0] in ids]  # every row of a kept query, in the pool's order
        assert all(study.in_half(t) for t in inside) and not any(study.in_half(t) for t in outside)
        before = path.read_text()
        study.half_pools(tmp_path)  # idempotent: an existing half is kept as it is
        assert path.read_text() == before
