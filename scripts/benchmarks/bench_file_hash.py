"""Benchmark: the cost of fingerprinting inputs by whole-file content hashes, as every command does.

Writes a model folder (a ``--model-mb`` weights file of random bytes beside small config files) and a BEIR folder (a
``--corpus-mb`` ``corpus.jsonl`` of generated documents, queries and qrels) into ``--work`` (default: a temporary
folder on the output's disk), then times, each in a fresh process (as a command starts):

* ``cold``: :func:`~hf_cocodr.rundir.run_record.fingerprint` with an empty hash memo (every byte read and hashed;
  the file is in the page cache, as just written: a first read from a disk adds its read time);
* ``memoized``: the same with the memo the first left (``<cache>/file_hashes``): a ``stat`` and a small JSON read;
* ``after a rewrite``: the same once the weights' middle MiB is rewritten in place with the modification time put
  back (the memo's rule sees the change time: hashed again, and the fingerprint differs);
* ``head and tail``: for comparison, the hash of the first and last MiB alone (the fingerprint before issue 66).

    python scripts/benchmarks/bench_file_hash.py [--model-mb 400] [--corpus-mb 100] [--out reports/benchmarks/bench_file_hash.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import hashlib, json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from hf_cocodr.rundir.run_record import fingerprint
t1 = time.perf_counter()
fp = fingerprint(sys.argv[1])
t2 = time.perf_counter()
print(json.dumps({"seconds": t2 - t1, "import_seconds": t1 - t0, "digest": hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()}))
"""

HEAD_TAIL = """
import hashlib, json, sys, time
from pathlib import Path
MIB = 1 << 20
t0 = time.perf_counter()
for p in sorted(Path(sys.argv[1]).rglob("*")):
    if p.is_file():
        size = p.stat().st_size
        h = hashlib.sha256()
        with open(p, "rb") as f:
            h.update(f.read(MIB))
            if size > MIB:
                f.seek(max(size - MIB, MIB))
                h.update(f.read(MIB))
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def _write_model(folder: Path, mb: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 384}))
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"w{i}": i for i in range(30000)}}}))
    with open(folder / "model.safetensors", "wb") as f:
        for _ in range(mb):
            f.write(os.urandom(1 << 20))
    return folder / "model.safetensors"


def _write_corpus(folder: Path, mb: int) -> None:
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    words = "tide harbour crane ledger quay ballast hull rigging keel mooring bollard cargo".split()
    target, written, i = mb << 20, 0, 0
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as f:
        while written < target:
            text = " ".join(words[(i * 7 + j) % len(words)] for j in range(80))
            line = json.dumps({"_id": f"d{i}", "title": f"note {i}", "text": text}) + "\n"
            f.write(line)
            written += len(line)
            i += 1
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as f:
        for q in range(200):
            f.write(
                json.dumps({"_id": f"q{q}", "text": f"{words[q % len(words)]} {words[(q + 3) % len(words)]}"}) + "\n"
            )
    with open(folder / "qrels" / "dev.tsv", "w") as f:
        f.write("query-id\tcorpus-id\tscore\n" + "".join(f"q{q}\td{q * 5}\t1\n" for q in range(200)))


def _run(code: str, target: Path, env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, str(target)], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rewrite_middle(weights: Path) -> None:
    st = weights.stat()
    with open(weights, "r+b") as f:
        f.seek(st.st_size // 2)
        f.write(os.urandom(1 << 20))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # the modification time put back


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-mb", type=int, default=400)
    ap.add_argument("--corpus-mb", type=int, default=100)
    ap.add_argument("--work", default=None, help="where the inputs are written (default: a temporary folder)")
    ap.add_argument("--out", default="reports/benchmarks/bench_file_hash.json")
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        env = {**os.environ, "HF_COCODR_CACHE": str(work / "cache"), "PYTHONPATH": str(root)}
        weights = _write_model(work / "model", args.model_mb)
        _write_corpus(work / "corpus", args.corpus_mb)
        time.sleep(2.5)  # past the memo's racy window: the files were just written
        rows, digests = [], {}
        for name, target, mb in (
            ("model", work / "model", args.model_mb),
            ("corpus", work / "corpus", args.corpus_mb),
        ):
            cold = _run(CHILD, target, env)
            memo = _run(CHILD, target, env)
            row = {
                "input": name,
                "mb": mb,
                "cold_s": round(cold["seconds"], 3),
                "cold_mb_per_s": round(mb / cold["seconds"], 1),
                "memoized_s": round(memo["seconds"], 4),
                "head_tail_s": round(_run(HEAD_TAIL, target, env)["seconds"], 4),
                "same_fingerprint_memoized": cold["digest"] == memo["digest"],
            }
            if name == "model":
                _rewrite_middle(weights)
                time.sleep(2.5)
                again = _run(CHILD, target, env)
                row["after_rewrite_s"] = round(again["seconds"], 3)
                row["rewrite_changes_fingerprint"] = again["digest"] != memo["digest"]
            digests[name] = cold["digest"]
            rows.append(row)
    print(
        f"{'input':<8}{'MB':>6}{'cold s':>9}{'MB/s':>8}{'memo s':>9}{'head+tail s':>13}{'rewrite s':>11}  rewrite seen"
    )
    for r in rows:
        seen = {True: "yes", False: "NO"}.get(r.get("rewrite_changes_fingerprint"), "-")
        after = f"{r['after_rewrite_s']:>11.3f}" if "after_rewrite_s" in r else f"{'-':>11}"
        print(
            f"{r['input']:<8}{r['mb']:>6}{r['cold_s']:>9.3f}{r['cold_mb_per_s']:>8.0f}{r['memoized_s']:>9.4f}"
            f"{r['head_tail_s']:>13.4f}{after}  {seen}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "cpu": _cpu()}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
