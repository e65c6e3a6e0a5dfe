"""The development suite: corpora of several kinds, and whether a default holds on every one of them (issue 64).

A default of the corpus-only path is chosen on corpora we have; a user's corpus is one we have not seen. So every
default is checked on each corpus of :data:`SUITE` (scientific claims, medical questions, news questions, web
questions where the start model was trained, SQuAD's Wikipedia questions as a target, and any extra BEIR folder given
with ``--extra NAME=PATH:SPLIT``), and chosen leave-one-corpus-out (``--loco``: chosen on the others, it must hold on
the one left out).

Each corpus gets two kinds of rows, each cached under ``--work`` (a row whose command did not finish runs again):

- ``baseline``: ``hf-cocodr evaluate MODEL FOLDER --split SPLIT --hybrid``, the user's own command: the start's
  dense model, BM25 and their hybrid with the fusion fitted without labels (the queries' text only);
- ``recipe`` arms: ``hf-cocodr recipe`` from the corpus alone (no query of the user's), on that one corpus, from a
  cold cache in a subprocess pinned to one core (``--core``), ``--max-minutes`` (15), ``--guard record`` (the guard
  reads and records, the adapted model is kept and scored whatever it says), ``--eval FOLDER:SPLIT``.

The table gives, per corpus: the start, BM25, the fitted hybrid (and whether it is ≥ max(dense, BM25) − 0.005),
each arm's adapted dense and hybrid gain over the start (mean ± half-range over seeds), and the guard's verdicts
against the labels'.

    python scripts/studies/suite.py baseline
    python scripts/studies/suite.py recipe --arms default --seeds 42,43,44 --core 1
    python scripts/studies/suite.py report [--loco]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from cpu_budget import pinned_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NOTES = ("<!-- findings: written by hand, kept when the table is written again -->", "<!-- end of findings -->")
MARGIN = 0.005  # the tolerance: a hybrid ≥ max(dense, BM25) − MARGIN, an adapted model ≥ start − MARGIN
SQUAD_QUERIES = 1000


@dataclass(frozen=True)
class Corpus:
    name: str
    kind: str  # what kind of corpus and queries, for the table
    split: str
    source: str  # the folder under HF_COCODR_DATA it is built from (or a path, for --extra)
    build: str = "link"  # "link": the folder as it is; "scifact-odd", "squad-dev": built under WORK/data


SUITE = {
    c.name: c
    for c in (
        Corpus("scifact", "scientific claims against abstracts (odd-id train claims)", "dev", "scifact", "scifact-odd"),
        Corpus("nfcorpus", "medical questions against PubMed abstracts", "dev", "nfcorpus"),
        Corpus("nq-utd", "questions on 2023-2024 news against news passages", "dev", "nq-utd"),
        Corpus("msmarco", "web questions against web passages (the start model's own kind)", "dev",
               "msmarco-trecdl19-5k"),
        Corpus("squad", "Wikipedia questions against their paragraphs (dev, 1,000 questions)", "dev", "squad-v1.1",
               "squad-dev"),
    )
}  # fmt: skip
# corpora brought in beside the shared data (outside the repository: research-only licences), under
# HF_COCODR_EXTRA_DATA (default: extra_data beside the checkout); the suite report says where each
# came from and how it was converted. A corpus whose folder is missing is left out of the suite (and said so).
EXTRA = {
    c.name: c
    for c in (
        Corpus("wikiqa", "Bing questions against single Wikipedia sentences (titles: their articles)", "dev",
               "wikiqa"),
        Corpus("financebench", "analyst questions against the pages of SEC filings", "test", "financebench_pages"),
        Corpus("arcd", "Arabic questions against Arabic paragraphs (the start model is English-only)", "test",
               "agentset_arcd_ar"),
    )
}  # fmt: skip


def extra_root() -> Path:
    return Path(os.environ.get("HF_COCODR_EXTRA_DATA", ROOT.parent / "extra_data")).resolve()


def data_root() -> Path:
    return Path(os.environ.get("HF_COCODR_DATA", ROOT.parent / "shared" / "data")).resolve()


def corpora(ns) -> dict[str, Corpus]:
    """The suite, extended by ``--extra NAME=PATH:SPLIT`` (another BEIR folder), restricted to ``--corpora``."""
    out = dict(SUITE)
    for name, c in EXTRA.items():
        path = extra_root() / c.source
        if (path / "qrels" / f"{c.split}.tsv").is_file():
            out[name] = Corpus(c.name, c.kind, c.split, str(path))
        else:
            print(f"(the suite's {name} is left out: no {path})", file=sys.stderr)
    for spec in ns.extra or []:
        name, _, rest = spec.partition("=")
        path, _, split = rest.rpartition(":")
        if not (name and path and split):
            raise SystemExit(f"--extra {spec!r}: expected NAME=PATH:SPLIT")
        out[name] = Corpus(name, f"extra: {Path(path).name}", split, str(Path(path).resolve()))
    if ns.corpora:
        wanted = ns.corpora.split(",")
        unknown = [c for c in wanted if c not in out]
        if unknown:
            raise SystemExit(f"--corpora: unknown {unknown}; the suite has {sorted(out)}")
        out = {c: out[c] for c in wanted}
    return out


def folder(corpus: Corpus, work: Path) -> Path:
    """The BEIR folder of ``corpus`` (the two derived ones written once under ``work/data``, atomically)."""
    src = Path(corpus.source) if os.path.isabs(corpus.source) else data_root() / corpus.source
    if corpus.build == "link":
        return src
    out = work / "data" / corpus.name
    if (out / "qrels" / f"{corpus.split}.tsv").is_file():
        return out
    tmp = work / "data" / f"{corpus.name}.tmp{os.getpid()}"  # (two studies may build it at once: one wins)
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "qrels").mkdir(parents=True)
    if corpus.build == "scifact-odd":  # the train claims with an odd id (the even ones are the studies' query log)
        for name in ("corpus.jsonl", "queries.jsonl"):
            (tmp / name).symlink_to((src / name).resolve())
        lines = (src / "qrels" / "train.tsv").read_text().splitlines()
        rows = [lines[0]] + [ln for ln in lines[1:] if int(ln.split("\t")[0]) % 2 == 1]
    elif corpus.build == "squad-dev":  # the dev paragraphs (2,067) and SQUAD_QUERIES dev questions drawn at random
        qrels = [ln.split("\t") for ln in (src / "qrels" / "dev.tsv").read_text().splitlines()[1:]]
        passages = {d for _, d, _ in qrels}
        picked = set(random.Random(0).sample(sorted({q for q, _, _ in qrels}), SQUAD_QUERIES))
        with open(src / "corpus.jsonl") as f, open(tmp / "corpus.jsonl", "w") as g:
            g.writelines(line for line in f if json.loads(line)["_id"] in passages)
        with open(src / "queries.jsonl") as f, open(tmp / "queries.jsonl", "w") as g:
            g.writelines(line for line in f if json.loads(line)["_id"] in picked)
        rows = ["query-id\tcorpus-id\tscore"] + ["\t".join(r) for r in qrels if r[0] in picked]
    else:
        raise ValueError(corpus.build)
    (tmp / "qrels" / f"{corpus.split}.tsv").write_text("\n".join(rows) + "\n")
    try:
        os.replace(tmp, out)
    except OSError:  # built by another process meanwhile
        shutil.rmtree(tmp)
    return out


def model_path() -> str:
    from hf_cocodr import bundled_model_path

    return str(bundled_model_path("all-MiniLM-L6-v2"))


def cli() -> list[str]:
    return [sys.executable, "-m", "hf_cocodr"]


# ---------------------------------------------------------------------------------------------------------- baseline
def baseline_row(corpus: Corpus, ns) -> dict:
    """The start, BM25 and the fitted hybrid on ``corpus`` (``hf-cocodr evaluate --hybrid``), cached."""
    out = Path(ns.work) / ns.baseline / corpus.name
    row_file = out / "row.json"
    if row_file.is_file():
        return json.loads(row_file.read_text())
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    data = folder(corpus, Path(ns.work))
    result = out / "evaluate.json"
    cmd = cli() + ["-q", "evaluate", model_path(), str(data), "--split", corpus.split, "--hybrid",
                   "--output", str(result)]  # fmt: skip
    if ns.core is not None:
        cmd = ["taskset", "-c", str(ns.core)] + cmd
    row = {"corpus": corpus.name, **pinned_run(out, cmd, Path(ns.work) / "cache" / "baseline")}
    if row["returncode"] == 0:
        r = json.loads(result.read_text())
        row.update(
            dense=r["dense"]["ndcg@10"],
            bm25=r["bm25"]["ndcg@10"],
            hybrid=r["ndcg@10"],
            fusion={k: r["fusion"][k] for k in ("normalize", "dense_weight")},
            queries=r["dense"].get("num_queries", r.get("num_queries")),
            docs=r["dense"].get("num_docs", r.get("num_docs")),
        )
    row_file.write_text(json.dumps(row, indent=2) + "\n")
    return row


# ------------------------------------------------------------------------------------------------------------ recipe
ARMS = {
    # today's corpus-only default: 8,000 pseudo-queries of the default mix distilled from the fixed hybrid into the
    # query side, then WiSE-FT 0.75; the teacher check and the guard record (the table reads what guard: on exports)
    "default": [],
    # a screen (issue 64, item 3): the teacher the recipe saves (its fusion fitted to the corpus without labels)
    # distilled instead of the fixed z-score one, whose check reads no lead on SQuAD (reports/studies/teacher_leads.md)
    "fit-teacher": ["--distill-teacher-weight", "fit"],
}


def recipe_row(corpus: Corpus, arm: str, seed: int, ns) -> dict:
    """One corpus-only recipe run on ``corpus`` (cold cache, pinned to ``--core``), cached."""
    folder_ = Path(ns.work) / f"recipe{ns.budget_minutes:g}" / arm / corpus.name / f"seed{seed}"
    row_file = folder_ / "row.json"
    if row_file.is_file():
        return json.loads(row_file.read_text())
    data = folder(corpus, Path(ns.work))
    out, cache = (folder_ / "run").absolute(), (folder_ / "cache").absolute()
    cmd = ["taskset", "-c", str(ns.core)] if ns.core is not None else []
    cmd += cli() + [
        "recipe", "--model", model_path(), "--target-corpus", str(data),
        "--source-data", str(data_root() / "squad-v1.1"),  # (read by no stage of the corpus-only schedule)
        "--output_dir", str(out), "--eval", f"{data}:{corpus.split}", "--max-minutes", f"{ns.budget_minutes:g}",
        "--guard", "record", "--seed", str(seed), *ARMS[arm],
    ]  # fmt: skip
    if (out / "recipe.json").is_file():  # the run finished, its row not written (its driver stopped): adopted
        row = {"corpus": corpus.name, "arm": arm, "seed": seed, "command": " ".join(cmd), "returncode": 0,
               "adopted": True}  # fmt: skip
    else:
        shutil.rmtree(folder_, ignore_errors=True)
        folder_.mkdir(parents=True)
        row = {"corpus": corpus.name, "arm": arm, "seed": seed, **pinned_run(folder_, cmd, cache)}
    return _row_results(row, out, data, corpus, row_file)


def reread_row(corpus: Corpus, arm: str, seed: int, ns) -> dict | None:
    """A finished recipe row read again with today's code: its command run again in its folder (the recipe resumes:
    every stage finished, so only the guard, the export, the evaluation and the saved hybrids run again, from the
    row's kept encoding cache; a run whose stages finished and whose last steps failed ends so too); the training's
    record is the first run's. None where the row has no run folder or its stages did not finish."""
    folder_ = Path(ns.work) / f"recipe{ns.budget_minutes:g}" / arm / corpus.name / f"seed{seed}"
    row_file, out = folder_ / "row.json", (folder_ / "run").absolute()
    if not row_file.is_file() or not out.is_dir():
        return None
    first = json.loads(row_file.read_text())
    if first.get("reread") == ns.reread_tag:
        return first
    if not (out / "recipe.json").is_file() and not (out / "wise" / "hf_cocodr_stage.json").is_file():
        return None  # (a run that failed before its stages finished is run again by `recipe`, not re-read)
    data = folder(corpus, Path(ns.work))
    cmd = first["command"].split()
    if ns.core is not None:
        cmd = ["taskset", "-c", str(ns.core)] + (cmd[3:] if cmd[0] == "taskset" else cmd)
    again = pinned_run(folder_, cmd, (folder_ / "cache").absolute())
    if again["returncode"] != 0:
        raise SystemExit(f"{folder_}: the re-read failed: {again.get('refused_or_failed')}")
    row = {k: first[k] for k in ("corpus", "arm", "seed", "command", "returncode") if k in first}
    row["first_run"] = {k: first.get(k) for k in ("dense", "hybrid", "guard", "teacher_check", "command_seconds")}
    row.update(reread=ns.reread_tag, reread_seconds=again["command_seconds"])
    return _row_results(row, out, data, corpus, row_file)


def _fusion(hybrid: dict) -> dict:
    f = hybrid.get("fusion") or {}
    return {k: f.get(k) for k in ("normalize", "dense_weight")}


def _row_results(row: dict, out: Path, data: Path, corpus: Corpus, row_file: Path) -> dict:
    if row["returncode"] == 0:
        ev = json.loads((out / "eval.json").read_text())[f"{data}:{corpus.split}"]
        rec = json.loads((out / "recipe.json").read_text())
        row.update(
            dense=ev["ndcg@10"],
            start=ev["start"]["ndcg@10"],
            hybrid=ev["hybrid"]["ndcg@10"],
            start_hybrid=ev["start"]["hybrid"]["ndcg@10"],
            bm25=ev["bm25"]["ndcg@10"],
            steps=rec.get("steps_trained", {}),
            guard={k: (rec.get("guard") or {}).get(k) for k in ("verdict", "kept", "readings", "why")},
            teacher_check={k: (rec.get("teacher_check") or {}).get(k) for k in ("leads", "difference", "se", "why")},
            kept=rec.get("kept") or rec.get("outcome"),
            wall_seconds=rec.get("wall_seconds"),
            fusions={"start": _fusion(ev["start"]["hybrid"]), "adapted": _fusion(ev["hybrid"])},
        )
    # (the run's encodings, OUT/../cache, are kept: a re-read of the row with today's code reads them)
    row_file.write_text(json.dumps(row, indent=2) + "\n")
    return row


# ------------------------------------------------------------------------------------------------------------ report
def spread(vals: list[float]) -> str:
    if not vals:
        return "–"
    m = statistics.mean(vals)
    return f"{m:+.4f} ± {(max(vals) - min(vals)) / 2:.4f}" if len(vals) > 1 else f"{m:+.4f}"


def cached(ns, suite: dict[str, Corpus]) -> tuple[dict, dict]:
    work = Path(ns.work)
    base = {c: json.loads((work / ns.baseline / c / "row.json").read_text())
            for c in suite if (work / ns.baseline / c / "row.json").is_file()}  # fmt: skip
    recipe: dict[str, dict[str, dict[int, dict]]] = {}
    root = work / f"recipe{ns.budget_minutes:g}"
    for f in sorted(root.glob("*/*/seed*/row.json")) if root.is_dir() else []:
        row = json.loads(f.read_text())
        if row.get("corpus") in suite:
            recipe.setdefault(row["arm"], {}).setdefault(row["corpus"], {})[row["seed"]] = row
    return base, recipe


def exported(row: dict) -> bool:
    """Whether ``guard: on`` (the default) would have exported the adapted model of a ``--guard record`` row: the
    teacher check found a lead (else no distillation ran) and the guard read it ``better``."""
    lead = (row.get("teacher_check") or {}).get("leads")
    return lead is not False and (row.get("guard") or {}).get("verdict") == "better"


def arm_cells(rows: dict[int, dict]) -> dict:
    done = [r for r in rows.values() if "dense" in r]
    d = [r["dense"] - r["start"] for r in done]
    h = [r["hybrid"] - r["start_hybrid"] for r in done]
    # what a user of the default gets: the adapted model where the guard exports it, the start (no change) elsewhere
    d_on = [g if exported(r) else 0.0 for g, r in zip(d, done)]
    h_on = [g if exported(r) else 0.0 for g, r in zip(h, done)]
    verdicts = [str((r.get("guard") or {}).get("verdict")) for r in done]
    readings = [_readings(r) for r in done]
    leads = [str((r.get("teacher_check") or {}).get("leads")) for r in done]
    return {"seeds": len(done), "dense": d, "hybrid": h, "verdicts": verdicts, "leads": leads, "readings": readings,
            "dense_on": d_on, "hybrid_on": h_on,
            "holds": bool(done) and statistics.mean(d_on) >= -MARGIN and statistics.mean(h_on) >= -MARGIN,
            "labels_see": labels_see(d, h)}  # fmt: skip


def _readings(row: dict) -> str:
    """The guard's two decided readings of a row (adapted − start on the clozes, dense / hybrid, each ± its SE)."""
    got = (row.get("guard") or {}).get("readings") or {}
    parts = [
        f"{got[k]['difference']:+.3f}±{got[k]['se']:.3f}" for k in ("cloze", "cloze_hybrid") if "se" in got.get(k, {})
    ]
    return " / ".join(parts) or "–"


def labels_see(d: list[float], h: list[float]) -> str:
    """What the labels read of the adapted model against the start, beyond the seeds' spread and the margin:
    ``better`` / ``worse`` (dense and hybrid agree, or one is within the margin) or ``no difference``."""
    if not d:
        return "–"
    sides = []
    for vals in (d, h):
        m, half = statistics.mean(vals), (max(vals) - min(vals)) / 2
        sides.append("better" if m - half > MARGIN else "worse" if m + half < -MARGIN else "no difference")
    if "worse" in sides:
        return "worse"
    return "better" if "better" in sides else "no difference"


# the guard's rules compared on the same rows (each read from the rows' recorded readings): the veto of a decided
# reading at one standard error (the rule of 2026-12-03) and at two (the library's since 2026-12-04)
GUARD_VETOES = {"veto at 1 SE": 1.0, "veto at 2 SE": 2.0}


def rule_verdict(row: dict, veto: float) -> str:
    """The guard's verdict on a row's recorded readings under a veto at ``veto`` standard errors: ``worse`` where
    the dense or the hybrid cloze reading is below −veto SE, ``better`` where the dense one is above +1 SE, else
    ``unverified`` (and the row's own verdict where it has no cloze reading)."""
    got = (row.get("guard") or {}).get("readings") or {}
    cloze = got.get("cloze") or {}
    if "se" not in cloze:
        return str((row.get("guard") or {}).get("verdict"))
    decided = [r for r in (cloze, got.get("cloze_hybrid") or {}) if "se" in r]
    if any(r["difference"] < -veto * r["se"] for r in decided):
        return "worse"
    return "better" if cloze["difference"] > cloze["se"] else "unverified"


def with_rule(by_corpus: dict, veto: float) -> dict:
    """An arm's rows with each guard verdict read again under :func:`rule_verdict`."""
    return {
        c: {s: {**r, "guard": {**(r.get("guard") or {}), "verdict": rule_verdict(r, veto)}} for s, r in rows.items()}
        for c, rows in by_corpus.items()
    }


def loco(recipe: dict, suite: list[str]) -> list[dict]:
    """Leave-one-corpus-out: for each corpus, the arm chosen on the others (the one that holds on every other corpus
    with the largest mean dense gain as exported over them; the first such arm on a tie) and whether it holds on the
    one left out."""
    out = []
    for held in suite:
        rest = [c for c in suite if c != held]
        best, best_gain = None, None
        for arm, by_corpus in recipe.items():
            if not all(c in by_corpus for c in suite):
                continue
            cells = {c: arm_cells(by_corpus[c]) for c in suite}
            if not all(cells[c]["holds"] for c in rest):
                continue
            gain = statistics.mean(statistics.mean(cells[c]["dense_on"]) for c in rest)
            if best_gain is None or gain > best_gain:
                best, best_gain = arm, gain
        held_cell = arm_cells(recipe[best][held]) if best else None
        out.append({"held_out": held, "chosen": best, "holds_there": held_cell["holds"] if held_cell else None,
                    "dense": spread(held_cell["dense_on"]) if held_cell else "–",
                    "hybrid": spread(held_cell["hybrid_on"]) if held_cell else "–"})  # fmt: skip
    return out


def report(ns) -> None:
    suite = corpora(ns)
    base, recipe = cached(ns, suite)
    lines = [
        "# The development suite: the start, BM25, the fitted hybrid and the corpus-only recipe on corpora of "
        "several kinds",
        "",
        "all-MiniLM-L6-v2 as published, nDCG@10 on each corpus's dev queries. `hybrid ok`: the fitted hybrid is "
        f"≥ max(dense, BM25) − {MARGIN}. Recipe rows: the corpus-only recipe on that one corpus, "
        f"{ns.budget_minutes:g} minutes on one core from a cold cache, `--guard record`; gains over the start, mean ± "
        "half-range over seeds.",
        "",
        "| corpus | kind | docs | queries | start (dense) | BM25 | fitted hybrid (fusion) | hybrid ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c, corpus in suite.items():
        b = base.get(c)
        if not b or "dense" not in b:
            lines.append(f"| {c} | {corpus.kind} | | | (not run) | | | |")
            continue
        ok = b["hybrid"] >= max(b["dense"], b["bm25"]) - MARGIN
        fusion = f"{b['fusion']['normalize']} {b['fusion']['dense_weight']}"
        lines.append(
            f"| {c} | {corpus.kind} | {b.get('docs')} | {b.get('queries')} | {b['dense']:.4f} | {b['bm25']:.4f} | "
            f"{b['hybrid']:.4f} ({fusion}) | {'yes' if ok else '**no**'} |"
        )
    for arm, by_corpus in recipe.items():
        lines += ["", f"## Recipe arm `{arm}` ({' '.join(ARMS.get(arm, [])) or 'the defaults'})", "",
                  "| corpus | seeds | adapted: dense gain | adapted: hybrid gain | labels read | teacher leads | "
                  "guard verdicts | guard's clozes, dense / hybrid | exported (guard: on): dense | hybrid | "
                  "holds (both ≥ −0.005) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for c in suite:
            if c not in by_corpus:
                continue
            cell = arm_cells(by_corpus[c])
            if not cell["seeds"]:  # no row ran to the end: say how each ended
                ended = ", ".join(f"seed {k}: exit {r.get('returncode')}" for k, r in sorted(by_corpus[c].items()))
                lines.append(f"| {c} | 0 | ({ended}: see its log.txt) | | | | | | | | |")
                continue
            lines.append(
                f"| {c} | {cell['seeds']} | {spread(cell['dense'])} | {spread(cell['hybrid'])} | "
                f"{cell['labels_see']} | {', '.join(cell['leads'])} | {', '.join(cell['verdicts'])} | "
                f"{'; '.join(cell['readings'])} | "
                f"{spread(cell['dense_on'])} | {spread(cell['hybrid_on'])} | {'yes' if cell['holds'] else '**no**'} |"
            )
    if ns.loco:
        lines += ["", "## Leave one corpus out", "", "| left out | arm chosen on the others | holds there | exported: "
                  "dense | hybrid |", "|---|---|---|---|---|"]  # fmt: skip
        ran = [c for c in suite if any(arm_cells(by.get(c, {}))["seeds"] for by in recipe.values())]
        for r in loco(recipe, ran):  # (over the corpora some row ran to the end on)
            lines.append(f"| {r['held_out']} | {r['chosen']} | {r['holds_there']} | {r['dense']} | {r['hybrid']} |")
        if "default" in recipe:  # the guard's rules on the default's rows
            rules = {name: with_rule(recipe["default"], veto) for name, veto in GUARD_VETOES.items()}
            lines += ["", "## The guard's veto, leave one corpus out", "",
                      "The default's rows read again under each rule (from their recorded cloze readings); per "
                      "corpus, each rule's verdicts per seed and what it exports, then the rule chosen on the other "
                      "corpora.", "",
                      "| corpus | labels read | " + " | ".join(f"{n}: verdicts, exported dense / hybrid" for n in rules)
                      + " |", "|---|---|" + "---|" * len(rules)]  # fmt: skip
            for c in ran:
                cells = {n: arm_cells(by.get(c, {})) for n, by in rules.items()}
                first = next(iter(cells.values()))
                lines.append(f"| {c} | {first['labels_see']} | " + " | ".join(
                    f"{', '.join(x['verdicts'])}; {spread(x['dense_on'])} / {spread(x['hybrid_on'])}"
                    for x in cells.values()) + " |")  # fmt: skip
            lines += ["", "| left out | rule chosen on the others | holds there | exported: dense | hybrid |",
                      "|---|---|---|---|---|"]  # fmt: skip
            for r in loco(rules, ran):
                lines.append(
                    f"| {r['held_out']} | {r['chosen']} | {r['holds_there']} | {r['dense']} | {r['hybrid']} |"
                )
    lines += ["", "Commands:", "", "```", *ns.commands, "```", ""]
    if ns.report:  # the findings written by hand between the markers of the page are kept as they are
        page = Path(ns.report).with_suffix(".md")
        kept = page.read_text() if page.is_file() else ""
        found = kept[kept.find(NOTES[0]) : kept.find(NOTES[1]) + len(NOTES[1])] if NOTES[1] in kept else ""
        lines[1:1] = ["", found or f"{NOTES[0]}\n{NOTES[1]}"]
    text = "\n".join(lines)
    print(text)
    if ns.report:
        Path(ns.report).with_suffix(".md").write_text(text)
        Path(ns.report).with_suffix(".json").write_text(
            json.dumps({"baseline": base, "recipe": recipe}, indent=1, default=str) + "\n"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("baseline", "recipe", "reread", "report"))
    p.add_argument("--work", default="outputs/suite")
    p.add_argument("--corpora", default=None, help="a comma-separated subset of the suite")
    p.add_argument("--extra", action="append", help="NAME=PATH:SPLIT, another BEIR folder in the suite")
    p.add_argument("--arms", default="default")
    p.add_argument("--baseline", default="baseline", help="the folder under --work of the baseline rows")
    p.add_argument("--seeds", default="42")
    p.add_argument("--core", type=int, default=None)
    p.add_argument("--budget-minutes", type=float, default=15.0)
    p.add_argument("--loco", action="store_true")
    p.add_argument("--reread-tag", default="reread", help="reread: what the re-read rows are marked with")
    p.add_argument("--report", default=None, help="write the table to REPORT.md and the rows to REPORT.json")
    p.add_argument("--commands", action="append", default=[], help="the commands to print under the table")
    ns = p.parse_args()
    ns.work = str(Path(ns.work).resolve())  # (the runs key their evaluations by the built folders' absolute paths)
    suite = corpora(ns)
    if ns.what == "baseline":
        for corpus in suite.values():
            row = baseline_row(corpus, ns)
            print(json.dumps({k: row.get(k) for k in ("corpus", "dense", "bm25", "hybrid", "fusion")}), flush=True)
    elif ns.what == "recipe":
        for seed in [int(s) for s in ns.seeds.split(",")]:
            for arm in ns.arms.split(","):
                if arm not in ARMS:
                    raise SystemExit(f"unknown arm {arm!r}; known: {sorted(ARMS)}")
                for corpus in suite.values():
                    row = recipe_row(corpus, arm, seed, ns)
                    print(json.dumps({k: row.get(k) for k in ("corpus", "arm", "seed", "dense", "start", "hybrid",
                                                             "start_hybrid", "returncode")}), flush=True)  # fmt: skip
    elif ns.what == "reread":
        for seed in [int(s) for s in ns.seeds.split(",")]:
            for arm in ns.arms.split(","):
                for corpus in suite.values():
                    row = reread_row(corpus, arm, seed, ns)
                    if row is not None:
                        print(json.dumps({k: row.get(k) for k in ("corpus", "arm", "seed", "dense", "start", "hybrid",
                                                                 "start_hybrid", "reread")}), flush=True)  # fmt: skip
    else:
        report(ns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
