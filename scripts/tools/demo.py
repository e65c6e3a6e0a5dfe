"""``make demo``: the best label-free path on the bundled all-MiniLM-L6-v2 and SciFact, side by side, in minutes.

Five systems ranked on one evaluation split that nothing trains on, nDCG@10 and Recall@100:

1. BM25 (bm25s) over SciFact;
2. the start, all-MiniLM-L6-v2 as published;
3. the fitted hybrid of the two (``evaluate_retrieval(..., hybrid=True)``: the fusion fitted to the corpus without
   labels);
4. the recipe's adapted model given unlabelled queries: SciFact's train claims with an even id, read as a user's
   query log (``hf-cocodr recipe --target-queries DIR:log``: the hybrid distilled into the model's query side);
5. the recipe's adapted model from the corpus alone (``hf-cocodr recipe`` without queries: whatever the recipe's
   corpus-only default is, hf_cocodr/recipe/schedules.py).

Both recipe runs use ``guard: record``: the label-free guard reads and records its verdict (shown beside the row)
instead of putting the starting model back, so the table shows what each adaptation did to the evaluation split.

The evaluation split is the train claims with an odd id (their labels are the only ones read, and only to score);
a query of the log whose text is an evaluation query's is left out of the log. Both live in ``OUTPUT/data/scifact``
(the corpus and queries files are links to ``$HF_COCODR_DATA/scifact``). The recipe needs a source folder
(``$HF_COCODR_DATA/squad-v1.1``); a model without an MLM head is not fine-tuned on its labels by default.

Before it starts the demo times this machine's corpus encoding (a few seconds), sizes the two recipe budgets
(``--max-minutes``) so that the whole run takes about ``--minutes`` (default 15) and prints the plan with its
estimated minutes. The starting model encodes SciFact once: its vectors go to hf_cocodr's cache
(``$HF_COCODR_CACHE``, default ``~/.cache/hf_cocodr``) and both recipe runs read them from there. A second run
reuses the plan, the finished recipe stages (in ``OUTPUT``) and the cached encodings, and says so. It writes
``OUTPUT/demo.md`` (the table), ``OUTPUT/demo.png`` (nDCG@10 per system; needs matplotlib, the ``plots`` extra),
``OUTPUT/demo.json`` (every figure, and the systems the picture plots) and ``OUTPUT/demo.log`` (the library's log).

``OUTPUT`` is claimed as every hf_cocodr command claims its folder (an owner record ``hf_cocodr_run.json`` and a
lock): an entry of yours named like one the demo writes is refused, and so is a symbolic link at or below one (the
demo's own links to the corpus and queries files aside), before any work. Every file is written atomically (a
temporary sibling renamed into place). ``--fresh`` deletes only what the demo wrote: its table, picture, record, log
and plan, the files it wrote under ``data/``, and the recipe runs' own files (each run starts over, replacing only
its own entries).

    python scripts/tools/demo.py [--output outputs/demo] [--minutes 15] [--fresh]
    python scripts/tools/demo.py --smoke --model TINY_MODEL --data TINY_BEIR --source TINY_BEIR --output OUT

``--smoke`` runs the same steps with fixed tiny step counts and no budget (the test suite's tiny model and corpus:
tests/test_demo.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SPLIT_LOG, SPLIT_EVAL = "log", "dev"  # the query log the recipe may read; the split it is evaluated on
PLAN_FILE, TABLE_FILE, PNG_FILE, JSON_FILE, LOG_FILE = "plan.json", "demo.md", "demo.png", "demo.json", "demo.log"
RUNS = {"queries": "recipe_queries", "corpus": "recipe_corpus_only"}  # the two recipe output folders

# Estimates (minutes on 2 cores) of what is not the corpus encoding or a recipe's budget: loading and the
# probe; BM25, the queries and the fusion fit of the start's evaluation; a recipe's export, guard, evaluation and
# saved hybrid after its budget (its queries, BM25 index and fusion fit; the corpus vectors come from the cache
# unless its model encodes documents anew).
LOAD_MIN, EVAL_EXTRA_MIN, FINISH_MIN, MARGIN_MIN = 0.4, 0.5, 0.7, 0.5
BUDGET_MIN = {"queries": (2.0, 3.0), "corpus": (2.0, 6.0)}  # (least, most) --max-minutes of each recipe run
PROBE_DOCS = 48

SMOKE_CONFIG = dict(  # fixed tiny steps for whatever stages the schedules switch on
    coco_steps=2,
    finetune_steps=2,
    distill_steps=2,
    distill_k=3,
    guard_queries=12,
    coco={"per_device_train_batch_size": 4},
    finetune={"per_device_train_batch_size": 4},
    distill={"per_device_train_batch_size": 4},
)

logger = logging.getLogger("hf_cocodr.demo")


# ------------------------------------------------------------------------------------------------------- the data
def query_number(qid: str) -> int:
    """The id's number (SciFact's ids are numbers; another corpus's: the digits it ends with, else a hash)."""
    m = re.search(r"(\d+)$", qid)
    return int(m.group(1)) if m else zlib.crc32(qid.encode())


LINKED = ("corpus.jsonl", "queries.jsonl")  # the links the demo makes in OUTPUT/data/<name> (replaced as links)
DATA_FILES = (*LINKED, f"qrels/{SPLIT_LOG}.tsv", f"qrels/{SPLIT_EVAL}.tsv")  # what it writes there
ENTRIES = ("data", *RUNS.values(), PLAN_FILE, TABLE_FILE, PNG_FILE, JSON_FILE, LOG_FILE)  # what it writes in OUTPUT


class DemoError(ValueError):
    """A fault of the demo's input or output folder, printed in one line."""


def _link(link: Path, target: Path) -> None:
    """``link`` made a symbolic link to ``target`` in one rename (an earlier link of the demo is replaced itself,
    never what it points to)."""
    from hf_cocodr.storage import staged_file

    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    with staged_file(link) as tmp:
        tmp.symlink_to(target)


def split_queries(source: Path) -> dict[str, Any]:
    """``source``'s train judgements split by query id: ``dev`` (odd ids: the evaluation split) and ``log`` (even ids,
    less any whose text is an evaluation query's), with the qrels header and the count of even ones. An empty
    evaluation split is refused in one line (:class:`DemoError`): checked before any work."""
    from hf_cocodr.utils import normalize_query

    lines = (source / "qrels" / "train.tsv").read_text().splitlines()
    header, rows = (lines[0] if lines else ""), [r for r in lines[1:] if r.strip()]
    dev = [r for r in rows if query_number(_qid(r)) % 2 == 1]
    if not dev:
        raise DemoError(
            f"{source / 'qrels' / 'train.tsv'} judges no query with an odd id ({len(rows)} judgements): the demo "
            "evaluates on those; give a folder whose train qrels judge queries of both kinds"
        )
    texts = {}
    with open(source / "queries.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                texts[str(rec["_id"])] = rec.get("text", "")
    dev_texts = {normalize_query(texts.get(_qid(r), "")) for r in dev}
    even = [r for r in rows if query_number(_qid(r)) % 2 == 0]
    log = [r for r in even if normalize_query(texts.get(_qid(r), "")) not in dev_texts]
    return {"header": header, "dev": dev, "log": log, "even": even}


def _qid(row: str) -> str:
    return row.split("\t")[0]


def prepare_data(source: Path, out: Path) -> dict[str, Any]:
    """``out/<name>``: links to ``source``'s corpus and queries, ``qrels/log.tsv`` and ``qrels/dev.tsv``
    (:func:`split_queries`). Idempotent, every file written atomically (a link replaced as a link); returns the
    folder and the counts."""
    from hf_cocodr.utils import atomic_write_text

    split = split_queries(source)
    folder = out / source.name
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        _link(folder / name, (source / name).resolve())
    for name, kept in ((SPLIT_EVAL, split["dev"]), (SPLIT_LOG, split["log"])):
        path = folder / "qrels" / f"{name}.tsv"
        text = split["header"] + "\n" + "".join(f"{r}\n" for r in kept)
        if not path.is_file() or path.read_text() != text:
            atomic_write_text(path, text)
    count = lambda kept: len({_qid(r) for r in kept})  # noqa: E731
    return {
        "folder": folder,
        "eval_queries": count(split["dev"]),
        "log_queries": count(split["log"]),
        "log_dropped": count(split["even"]) - count(split["log"]),
    }


# ------------------------------------------------------------------------------------------------------ progress
@contextlib.contextmanager
def timed_bar(desc: str, seconds: float):
    """A progress bar over the estimated ``seconds`` of a step that reports no progress of its own (a recipe run),
    moved by the clock; it stops short of full until the step ends, and stretches when the step runs longer."""
    from tqdm.auto import tqdm

    total = max(1, int(seconds))
    bar = tqdm(total=total, desc=desc, unit="s", bar_format="{desc}: {percentage:3.0f}%|{bar}| {n}/{total} s est.")
    stop, t0 = threading.Event(), time.perf_counter()

    def tick():
        while not stop.wait(1.0):
            elapsed = int(time.perf_counter() - t0)
            if elapsed >= bar.total:
                bar.total = elapsed + 30
            bar.n = elapsed
            bar.refresh()

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.total = bar.n = max(1, int(time.perf_counter() - t0))
        bar.refresh()
        bar.close()


class _TqdmHandler(logging.Handler):
    def emit(self, record):
        from tqdm.auto import tqdm

        tqdm.write(self.format(record), file=sys.stderr)


def setup_logs(path: Path) -> None:
    """The library's log goes to ``path`` (INFO); its warnings also to the terminal, above the progress bars."""
    root = logging.getLogger("hf_cocodr")
    for handler in list(root.handlers):
        if getattr(handler, "_demo", False):
            root.removeHandler(handler)
    file_handler = logging.FileHandler(path, encoding="utf-8")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    term = _TqdmHandler(logging.WARNING)
    term.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    for handler in (file_handler, term):
        handler._demo = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False
    # the libraries' own bars (every checkpoint's "Writing model shards", every load's "Loading weights") would
    # bury the demo's: one bar per step is the demo's
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


# ---------------------------------------------------------------------------------------------------------- plan
def encode_probe(model: str, corpus: Path, precision: str) -> dict[str, float]:
    """Seconds this machine takes to encode the whole corpus with the starting model, from ``PROBE_DOCS`` documents
    spread through it (after a warm-up batch), in the precision the run encodes in."""
    from hf_cocodr import load_encoder
    from hf_cocodr.retrieval.encoding import encode_texts
    from hf_cocodr.retrieval.session import EncodingSession

    with open(corpus, encoding="utf-8") as f:
        docs = [json.loads(line) for line in f if line.strip()]
    texts = [f"{d.get('title', '')} {d.get('text', '')}".strip() for d in docs]
    step = max(1, len(texts) // PROBE_DOCS)
    sample = texts[::step][:PROBE_DOCS]
    st = load_encoder(model)
    session = EncodingSession(precision)
    encode_texts(st, sample[:8], kind="document", batch_size=16, session=session)  # warm-up
    t0 = time.perf_counter()
    encode_texts(st, sample, kind="document", batch_size=16, session=session)
    seconds = time.perf_counter() - t0
    return {"docs": len(texts), "probe_docs": len(sample), "encode_minutes": seconds / len(sample) * len(texts) / 60}


def corpus_only_encodes_documents(has_mlm_head: bool) -> bool:
    """Whether the recipe's corpus-only default changes the document side (so its model encodes the corpus again):
    any training stage but a query-side distillation does."""
    from hf_cocodr.recipe import RecipeConfig
    from hf_cocodr.recipe.schedules import choose_schedule

    cfg, _ = choose_schedule(RecipeConfig(), has_mlm_head)
    trains_documents = cfg.skip_coco is False or cfg.skip_finetune is False or cfg.wise_alpha
    return bool(trains_documents or (cfg.skip_distill is False and cfg.distill_side != "query"))


def make_plan(encode_min: float, reencode: bool, minutes: float) -> dict[str, Any]:
    """The two recipe budgets for a whole run of about ``minutes``, and the estimated minutes of each step. A
    corpus-only model that encodes the corpus anew does so inside its own budget (its guard ranks the corpus), so
    that budget gets the encoding on top."""
    fixed = LOAD_MIN + encode_min + EVAL_EXTRA_MIN + 2 * FINISH_MIN + MARGIN_MIN
    left = minutes - fixed
    extra = encode_min if reencode else 0.0
    lo, hi = BUDGET_MIN["queries"]
    budgets = {"queries": round(min(hi, max(lo, left / 3)), 1)}
    lo, hi = BUDGET_MIN["corpus"]
    budgets["corpus"] = round(min(hi + extra, max(lo + extra, left - budgets["queries"])), 1)
    steps = {
        "start": encode_min + EVAL_EXTRA_MIN,
        "queries": budgets["queries"] + FINISH_MIN,
        "corpus": budgets["corpus"] + FINISH_MIN,
    }
    rerun = {"start": EVAL_EXTRA_MIN, "queries": FINISH_MIN, "corpus": FINISH_MIN}  # stages and encodings reused
    return {
        "budgets": budgets,
        "estimates_minutes": {k: round(v, 1) for k, v in steps.items()},
        "total_minutes": round(LOAD_MIN + sum(steps.values()), 1),
        "estimates_rerun": rerun,
        "total_rerun_minutes": round(LOAD_MIN + sum(rerun.values()), 1),
    }


def print_plan(plan: dict[str, Any], data: dict[str, Any], model_name: str, reused: bool) -> None:
    est, b = plan["estimates_rerun" if reused and "estimates_rerun" in plan else "estimates_minutes"], plan["budgets"]
    print(f"hf_cocodr demo: {model_name} on {data['name']}, label-free, side by side", flush=True)
    print(
        f"  evaluation split: {data['eval_queries']} {data['name']} train claims with an odd id, never trained on; "
        f"query log: {data['log_queries']} with an even id"
        + (f" ({data['log_dropped']} left out: their text is an evaluation query's)" if data["log_dropped"] else "")
    )
    print(f"  corpus encodings cache: {plan['cache']}")
    if plan.get("smoke"):
        print("  smoke mode: fixed tiny step counts, no budget")
    budget = {k: "" if v is None else f" --max-minutes {v:g}" for k, v in b.items()}
    lines = [
        (
            "1",
            "the start, BM25 and the fitted hybrid"
            + (" (the corpus vectors from the cache)" if reused else " (encodes the corpus once, into the cache)"),
            est["start"],
        ),
        ("2", f"recipe with the query log: --target-queries DIR:{SPLIT_LOG}{budget['queries']}", est["queries"]),
        ("3", f"recipe from the corpus alone, its default schedule:{budget['corpus']}", est["corpus"]),
    ]
    for n, what, minutes in lines:
        print(f"  {n}. {what}" + ("" if plan.get("smoke") else f": about {minutes:.1f} min"))
    print("  (both recipe runs with guard: record, so the table shows each adapted model, its guard's verdict beside)")
    if reused:
        print(
            "  an earlier run's plan is in the output folder: reused (its finished recipe stages are skipped and "
            "the corpus encodings come from the cache), so this run is shorter"
            + ("" if plan.get("smoke") else f": about {plan.get('total_rerun_minutes', 0):.0f} minutes")
            + "; --fresh starts over"
        )
    elif not plan.get("smoke"):
        enc = plan["probe"]
        print(
            f"  this machine encodes the corpus in about {enc['encode_minutes']:.1f} min ({plan['precision']}); "
            f"about {plan['total_minutes']:.0f} minutes in all"
            + (
                f"; the corpus-only model encodes the corpus anew within its budget ({enc['encode_minutes']:.1f} min)"
                if plan["reencode"]
                else ""
            )
        )
    print(flush=True)


# ---------------------------------------------------------------------------------------------------------- steps
def evaluate_start(model: str, folder: Path, precision: str, batch_size: int) -> dict[str, Any]:
    """The start, BM25 and their fitted hybrid on the evaluation split, the corpus vectors written to (or read
    from) the encoding cache the recipe runs read; returns the result and how the vectors came. (The library's own
    encoding bar moves once per 4,096 documents, so the caller shows a bar of its own.)"""
    from hf_cocodr import evaluate_retrieval
    from hf_cocodr.retrieval.session import EncodingSession

    session = EncodingSession(precision, cache=True)
    res = evaluate_retrieval(
        model, folder, SPLIT_EVAL, hybrid=True, batch_size=batch_size, show_progress_bar=False, session=session
    )
    return {"result": res, "encodings": [r.get("source") for r in session.record]}


def run_one(
    kind: str, model: str, data: dict, source: Path, out: Path, budget: float | None, smoke: bool, fresh: bool = False
) -> dict:
    """One recipe run (``kind``: ``queries`` or ``corpus``) evaluated on the evaluation split; returns its summary,
    what it reused and its minutes, or the one-line reason it did not run. ``fresh``: the run starts over, replacing
    only an earlier run's own files there."""
    from hf_cocodr import run_recipe
    from hf_cocodr.errors import ConfigError
    from hf_cocodr.recipe.guard import DECIDES

    folder = data["folder"]
    # the start is step 1's; the guard reads and records (its verdict is shown), so the table shows the adapted model
    config: dict[str, Any] = {"evaluate_start": False, "guard": "record"}
    if kind == "queries":
        config["target_queries"] = [f"{folder}:{SPLIT_LOG}"]
    if smoke:
        config.update(SMOKE_CONFIG)
    run_dir = out / RUNS[kind]
    earlier = not fresh and (run_dir / "recipe.json").is_file()
    spec = f"{folder}:{SPLIT_EVAL}"
    t0 = time.perf_counter()
    try:  # (the trainers print their loss lines: into the log, not between the progress bars)
        with open(out / LOG_FILE, "a", encoding="utf-8") as log, contextlib.redirect_stdout(log):
            summary = run_recipe(
                model,
                [str(folder)],
                str(source),
                run_dir,
                evals=[spec],
                config=config,
                max_minutes=budget,
                resume=not fresh,
                overwrite_output_dir=fresh,
            )
    except (ConfigError, ValueError) as e:
        return {"error": str(e).splitlines()[0], "minutes": (time.perf_counter() - t0) / 60}
    record = json.loads((run_dir / "recipe.json").read_text())
    encodings = [r.get("source") for r in record.get("corpus_encodings", [])]
    guard = record.get("guard") or {}
    readings = guard.get("readings") or {}
    return {
        "guard": {
            name: f"{r.get('difference', 0.0):+.4f} ± {r.get('se') or 0.0:.4f} over {r.get('queries')}, {r.get('verdict')}"
            + ("" if name in DECIDES else " (recorded, not decided on)")
            for name, r in readings.items()
            if isinstance(r, dict)
        },
        "guard_verdict": guard.get("verdict"),
        "result": summary[spec],
        "minutes": (time.perf_counter() - t0) / 60,
        "earlier_run": earlier,
        "encoded": encodings.count("encoded"),
        "from_cache": encodings.count("disk cache"),
        "schedule": record.get("schedule", {}).get("kind"),
        "steps": record.get("steps_trained"),
        "train_minutes": round(record.get("train_seconds", 0.0) / 60, 1),
        "model": str(run_dir / "model"),
    }


# ---------------------------------------------------------------------------------------------------------- table
def build_rows(start: dict, runs: dict[str, dict], model_name: str) -> list[dict[str, Any]]:
    res = start["result"]
    rows = [
        dict(key="bm25", system="BM25 (bm25s)", needs="the corpus", **pick(res["bm25"])),
        dict(key="start", system=f"start: {model_name}", needs="nothing", **pick(res["dense"])),
        dict(key="hybrid", system="fitted hybrid: start + BM25", needs="the corpus", **pick(res)),
    ]
    labels = {
        "queries": ("adapted with the query log (recipe --target-queries)", "the corpus + unlabelled queries"),
        "corpus": ("adapted from the corpus alone (recipe default)", "the corpus"),
    }
    for kind, (system, needs) in labels.items():
        run = runs[kind]
        row = dict(key=kind, system=system, needs=needs)
        if "error" in run:
            row.update({"ndcg@10": None, "recall@100": None, "note": f"not run: {run['error']}"})
        else:
            row.update(pick(run["result"]))
            row["hybrid_ndcg@10"] = run["result"]["hybrid"]["ndcg@10"]
            verdicts = run.get("guard") or {}
            worse = run.get("guard_verdict") == "worse"
            row["note"] = f"schedule {run['schedule']}, steps {run['steps']}; label-free guard: " + (
                "; ".join(f"{name} {v}" for name, v in sorted(verdicts.items())) or "no reading"
            )
            if worse:
                row["note"] += " (with the guard on, the recipe's default, it would have kept the starting model)"
        rows.append(row)
    base = rows[1]["ndcg@10"]
    for row in rows:
        row["vs_start"] = None if row["ndcg@10"] is None else row["ndcg@10"] - base
    return rows


def pick(metrics: dict) -> dict[str, float]:
    return {"ndcg@10": metrics["ndcg@10"], "recall@100": metrics["recall@100"]}


def table(rows: list[dict[str, Any]], title: str) -> str:
    fmt = lambda v, sign=False: "–" if v is None else (f"{v:+.4f}" if sign else f"{v:.4f}")  # noqa: E731
    lines = [title, "", "| system | nDCG@10 | vs start | Recall@100 | needs |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['system']} | {fmt(r['ndcg@10'])} | {fmt(r['vs_start'], True)} | {fmt(r['recall@100'])} "
            f"| {r['needs']} |"
        )
    notes = [f"- {r['system']}: {r['note']}" for r in rows if r.get("note")]
    fused = [f"{r['system']} {r['hybrid_ndcg@10']:.4f}" for r in rows if r.get("hybrid_ndcg@10") is not None]
    if fused:
        notes.append("- fused with BM25 (fitted hybrid), nDCG@10: " + "; ".join(fused))
    return "\n".join(lines + [""] + notes) + "\n"


def write_png(rows: list[dict[str, Any]], path: Path, title: str) -> dict[str, Any]:
    """A bar per system with its nDCG@10 (a system that did not run is left out); returns what was plotted, or why
    there is no picture."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {"png": None, "why": "matplotlib is not installed (pip install 'hf-cocodr[plots]')"}
    shown = [r for r in rows if r["ndcg@10"] is not None]
    colors = {"bm25": "#8c8c8c", "start": "#4c72b0", "hybrid": "#55a868", "queries": "#c44e52", "corpus": "#dd8452"}
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=100)
    short = {
        "bm25": "BM25",
        "start": "start",
        "hybrid": "fitted hybrid\n(start + BM25)",
        "queries": "adapted:\nquery log",
        "corpus": "adapted:\ncorpus alone",
    }
    labels = [short[r["key"]] for r in shown]
    bars = ax.bar(range(len(shown)), [r["ndcg@10"] for r in shown], color=[colors[r["key"]] for r in shown])
    for bar, r in zip(bars, shown):
        ax.annotate(
            f"{r['ndcg@10']:.4f}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_xticks(range(len(shown)), labels, fontsize=8)
    ax.set_ylabel("nDCG@10")
    ax.set_title(title, fontsize=10)
    values = [r["ndcg@10"] for r in shown]
    top, bottom = max(values + [0.01]), max(0.0, math.floor(min(values) * 10) / 10 - 0.1)
    ax.set_ylim(bottom, top + (top - bottom) * 0.12)
    if bottom > 0:
        ax.set_ylabel(f"nDCG@10 (the axis starts at {bottom:.1f})")
    fig.tight_layout()
    from hf_cocodr.storage import staged_file

    with staged_file(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return {"png": str(path), "bars": len(bars), "systems": [r["key"] for r in shown]}


# ----------------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output", default="outputs/demo")
    ap.add_argument("--minutes", type=float, default=15.0, help="the whole run's target wall time (sizes the budgets)")
    ap.add_argument(
        "--fresh", action="store_true", help="delete what an earlier demo run wrote in --output first (nothing else)"
    )
    ap.add_argument("--model", default=None, help="default: the bundled all-MiniLM-L6-v2")
    ap.add_argument(
        "--data", default=None, help="a BEIR folder with qrels/train.tsv (default: $HF_COCODR_DATA/scifact)"
    )
    ap.add_argument("--source", default=None, help="the recipe's source folder (default: $HF_COCODR_DATA/squad-v1.1)")
    ap.add_argument("--smoke", action="store_true", help="fixed tiny step counts, no budget (for a tiny model)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    t_start = time.perf_counter()
    from hf_cocodr.utils import get_data_root

    root = get_data_root()
    data_dir = Path(ns.data) if ns.data else root / "scifact"
    source = Path(ns.source) if ns.source else root / "squad-v1.1"
    for folder, what in ((data_dir, "qrels/train.tsv"), (source, "corpus.jsonl")):
        if not (folder / what).is_file():
            print(f"demo: {folder / what} not found; set HF_COCODR_DATA to the folder holding it", file=sys.stderr)
            return 2
    out = Path(ns.output)
    try:
        split_queries(data_dir)  # (an empty evaluation split: one line, before the output folder is claimed)
        folder = claim_output(out)
    except (DemoError, OSError, ValueError) as e:
        print(f"demo: {e}", file=sys.stderr)
        return 2
    try:
        if ns.fresh:
            remove_own(out, folder)
        return run_demo(ns, out, data_dir, source, t_start)
    except DemoError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 2
    finally:
        folder.release()


def claim_output(out: Path):
    """``out`` claimed for the demo (owner record and lock, :class:`~hf_cocodr.rundir.run_record.RunFolder`): a folder
    another hf_cocodr command wrote is refused, an entry of the user's named like one the demo writes too, and so is
    a symbolic link at or below an entry the demo writes (its own links to the corpus and queries aside); the user's
    other entries stay beside, untouched. Its entries are declared before any is written."""
    from hf_cocodr.rundir.run_record import RunFolder, read_record

    earlier = read_record(out)
    if earlier is not None and earlier.get("command") != "demo":
        raise DemoError(
            f"{out} holds a run of `hf-cocodr {earlier.get('command')}`, not the demo's: give the demo its own folder"
        )
    links = [f"data/*/{name}" for name in LINKED]
    folder = RunFolder.claim(out, "demo", None, resume=True, overwrite=True, writes=ENTRIES, links=links)
    folder.expect(ENTRIES)
    return folder


def remove_own(out: Path, folder) -> None:
    """``--fresh``: remove what an earlier demo wrote in ``out`` and nothing else: its files at the top, the files it
    wrote under ``data/<name>/`` (then the folders left empty), and, for each recipe run, that run's own files (the
    run starts over with ``resume=False``, which replaces only its own entries)."""
    own = set(folder.record.get("files", [])) | set(folder.record.get("expected", []))
    for name in (PLAN_FILE, TABLE_FILE, PNG_FILE, JSON_FILE, LOG_FILE):
        if name in own and ((out / name).is_file() or (out / name).is_symlink()):
            (out / name).unlink()
    data = out / "data"
    if "data" in own and data.is_dir() and not data.is_symlink():
        for sub in sorted(p for p in data.iterdir() if p.is_dir() and not p.is_symlink()):
            for name in DATA_FILES:
                if (sub / name).is_file() or (sub / name).is_symlink():
                    (sub / name).unlink()
            for empty in (sub / "qrels", sub):
                with contextlib.suppress(OSError):
                    empty.rmdir()  # (only when empty: a file of the user's keeps its folder)
        with contextlib.suppress(OSError):
            data.rmdir()


def run_demo(ns: argparse.Namespace, out: Path, data_dir: Path, source: Path, t_start: float) -> int:
    """The demo's steps in its claimed output folder ``out``."""
    from hf_cocodr.utils import atomic_write_text

    setup_logs(out / LOG_FILE)

    import torch

    from hf_cocodr import bundled_model_path
    from hf_cocodr.modeling.condenser import checkpoint_has_mlm_head
    from hf_cocodr.modeling.precision import resolve_corpus_precision
    from hf_cocodr.storage import cache_root

    model = ns.model or bundled_model_path("all-MiniLM-L6-v2")
    model_name = "all-MiniLM-L6-v2" if ns.model is None else Path(model).name
    data = prepare_data(data_dir, out / "data")
    data["name"] = data_dir.name
    precision = resolve_corpus_precision("auto")[0]
    batch_size = 64 if torch.cuda.is_available() else 16
    has_mlm = checkpoint_has_mlm_head(model)
    inputs = {"model": str(Path(model).resolve()), "data": str(data_dir.resolve()), "smoke": ns.smoke}
    inputs.update(minutes=ns.minutes, cache=str(cache_root().resolve()), precision=precision)
    plan_path = out / PLAN_FILE
    earlier = json.loads(plan_path.read_text()) if plan_path.is_file() else None
    reused = bool(earlier and earlier.get("inputs") == inputs)
    if reused:
        plan = earlier
    else:
        reencode = corpus_only_encodes_documents(has_mlm)
        if ns.smoke:
            plan = {"budgets": {"queries": None, "corpus": None}, "smoke": True, "reencode": reencode}
            plan["estimates_minutes"] = {"start": 0.0, "queries": 0.0, "corpus": 0.0}
        else:
            probe = encode_probe(model, data_dir / "corpus.jsonl", precision)
            plan = make_plan(probe["encode_minutes"], reencode, ns.minutes)
            plan.update(probe=probe, reencode=reencode)
        plan.update(inputs=inputs, cache=inputs["cache"], precision=precision)
        atomic_write_text(plan_path, json.dumps(plan, indent=2))
    print_plan(plan, data, model_name, reused)

    est = plan["estimates_minutes"] if not reused else plan.get("estimates_rerun", plan["estimates_minutes"])
    print(f"1/3 the start, BM25 and the fitted hybrid on {data['name']}:{SPLIT_EVAL}", flush=True)
    t0 = time.perf_counter()
    with timed_bar("    start, BM25, hybrid", est["start"] * 60):
        start = evaluate_start(model, data["folder"], precision, batch_size)
    start["minutes"] = (time.perf_counter() - t0) / 60
    cached = start["encodings"].count("disk cache")
    print(
        f"    done in {start['minutes']:.1f} min; the start's corpus vectors: "
        + ("read from the cache" if cached and not start["encodings"].count("encoded") else "encoded and cached"),
        flush=True,
    )
    runs = {}
    for n, kind, what in ((2, "queries", "with the query log"), (3, "corpus", "from the corpus alone")):
        print(
            f"{n}/3 the recipe {what}" + ("" if ns.smoke else f" (--max-minutes {plan['budgets'][kind]:g})"),
            flush=True,
        )
        with timed_bar(f"    recipe {what}", est[kind] * 60):
            runs[kind] = run = run_one(kind, model, data, source, out, plan["budgets"][kind], ns.smoke, ns.fresh)
        if "error" in run:
            print(f"    not run: {run['error']}", flush=True)
            continue
        reuse = []
        if run["earlier_run"]:
            reuse.append(f"an earlier run in {out / RUNS[kind]}: its finished stages were skipped")
        if run["from_cache"]:
            reuse.append(f"{run['from_cache']} corpus encoding(s) read from the cache")
        print(
            f"    done in {run['minutes']:.1f} min"
            + ("" if run["earlier_run"] else f" (training {run['train_minutes']:.1f})")
            + f"; corpus encodings made: {run['encoded']}"
            + ("; " + "; ".join(reuse) if reuse else ""),
            flush=True,
        )

    rows = build_rows(start, runs, model_name)
    total = (time.perf_counter() - t_start) / 60
    title = (
        f"{model_name} on {data['name']}: {data['eval_queries']} evaluation queries never trained on, "
        f"no relevance label read for training ({total:.1f} min{', reusing earlier work' if reused else ''})"
    )
    text = table(rows, title)
    atomic_write_text(out / TABLE_FILE, text)
    picture = write_png(rows, out / PNG_FILE, f"{model_name} on {data['name']} (evaluation split): nDCG@10")
    record = {"rows": rows, "plan": plan, "runs": runs, "picture": picture, "minutes": round(total, 2)}
    record["start"] = {
        "minutes": start["minutes"],
        "encodings": start["encodings"],
        "fusion": start["result"]["fusion"],
    }
    atomic_write_text(out / JSON_FILE, json.dumps(record, indent=2, default=str))
    print()
    print(text)
    if picture["png"]:
        print(f"picture: {picture['png']} ({picture['bars']} bars); table: {out / TABLE_FILE}; log: {out / LOG_FILE}")
    else:
        print(f"no picture: {picture['why']}; table: {out / TABLE_FILE}; log: {out / LOG_FILE}")
    print(f"adapted models: {out / RUNS['queries'] / 'model'}, {out / RUNS['corpus'] / 'model'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
