"""Queries are compared by their words (issue 66, item 4): the overlap guard, the pseudo-query exclusion and the
de-duplication ignore case, punctuation, apostrophes and spacing, so an evaluation query with a question mark, a
full stop or quotation marks added is still an evaluation query."""

from __future__ import annotations

import json

import pytest

from hf_cocodr.data.target_queries import read_target_queries, refuse_eval_overlap
from hf_cocodr.errors import ConfigError
from hf_cocodr.retrieval.pseudo_queries import PseudoQueryDrawer
from hf_cocodr.utils import normalize_query


def _evalset(folder, queries: dict[str, str], split: str = "holdout"):
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(json.dumps({"_id": "m1", "title": "", "text": "a mooring log"}) + "\n")
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items())
    )
    (folder / "qrels" / f"{split}.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\tm1\t1\n" for q in queries)
    )
    return f"{folder}:{split}"


@pytest.mark.parametrize(
    "logged",
    [
        "which tugboat berths at pier nine?",
        "Which tugboat berths at pier nine.",
        '"which tugboat berths, at pier nine"',
        "which tugboat berths at pier-nine!!",
        "(Which) tugboat berths at pier nine …",
    ],
)
def test_a_logged_query_that_is_an_evaluation_query_but_for_punctuation_is_refused(tmp_path, logged):
    spec = _evalset(tmp_path / "harbour", {"h1": "Which tugboat berths at pier nine", "h2": "tide at dawn"})
    log = tmp_path / "searches.jsonl"
    log.write_text(json.dumps({"text": "bollard load rating"}) + "\n" + json.dumps({"text": logged}) + "\n")
    with pytest.raises(ConfigError, match="holds a query of the --eval split .*query 'h1'"):
        refuse_eval_overlap([str(log)], [spec])


def test_queries_that_differ_in_a_word_or_a_symbol_are_not_refused(tmp_path):
    spec = _evalset(tmp_path / "harbour", {"h1": "c++ crane controller", "h2": "cafés on the quay"})
    log = tmp_path / "searches.jsonl"
    log.write_text(
        json.dumps({"text": "c crane controller"}) + "\n" + json.dumps({"text": "cafes on the quay"}) + "\n"
    )
    refuse_eval_overlap([str(log)], [spec])  # symbols and accents are kept: other queries


def test_an_evaluation_query_with_a_full_stop_is_never_drawn_as_an_inverse_cloze_query():
    ids, titles = ["n1", "n2"], ["", ""]
    bodies = ["Ballast water shifts the hull. Aye.", "Cranes unload the cargo at night. Yes."]
    drawer = PseudoQueryDrawer(ids, titles, bodies, seed=4)
    plain = [p.text for p in drawer.draw(4, "ict")]
    assert "Ballast water shifts the hull." in plain
    kept = [
        p.text
        for p in PseudoQueryDrawer(ids, titles, bodies, seed=4).draw(
            4, "ict", exclude=["ballast WATER shifts the hull?"]
        )
    ]
    assert "Ballast water shifts the hull." not in kept
    assert {normalize_query(t) for t in kept} == {normalize_query(t) for t in plain} - {
        "ballast water shifts the hull"
    }


def test_a_query_repeated_with_other_punctuation_is_kept_once(tmp_path):
    log = tmp_path / "searches.jsonl"
    lines = ["Where's the harbour master?", "wheres the harbour master", "where’s the harbour-master.", "!?"]
    log.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    assert read_target_queries(log).texts == ["Where's the harbour master?"]
