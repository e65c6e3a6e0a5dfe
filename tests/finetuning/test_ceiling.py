"""The ceiling of query-side distillation (hf_cocodr.finetuning.ceiling): hand-made cases where the teacher's order
is reachable by some query vector, and one where no vector can reach it."""

from __future__ import annotations

import numpy as np
import pytest

from hf_cocodr.finetuning.ceiling import free_query_vectors, order_reachable

# four documents in the plane; the teacher's order e1 > e2 > e4 > e3 asks for q = (a, b) with a > b > -b > -a,
# i.e. a > b > 0: reachable (q = (2, 1) gives 2, 1, -1, -2)
DOCS = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
ORDER = [0, 1, 3, 2]


def test_a_reachable_order_is_found_and_the_free_vector_reaches_it():
    assert order_reachable(DOCS, ORDER, similarity="dot")
    assert order_reachable(DOCS, ORDER, similarity="cosine")
    teacher = np.array([[3.0, 2.0, 1.0, 0.0]])  # its scores over the four, best first
    start = np.array([[0.0, 1.0]])  # a start that ranks e2 first
    q = free_query_vectors(DOCS, [ORDER], teacher, start, in_batch_weight=0.0, steps=300, lr=0.05)
    ranked = np.argsort(-(DOCS @ q[0]), kind="stable").tolist()
    assert ranked == ORDER
    assert np.argsort(-(DOCS @ start[0]), kind="stable").tolist() != ORDER  # it had to move


def test_an_order_no_vector_can_reach_is_reported_unreachable():
    """d2 = 2 d1: ranking d1 above d2 needs q·d1 < 0, ranking d2 above d3 and d3 above d4 = -d3 needs
    2 q·d1 > q·d3 > 0: no vector does both."""
    docs = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    assert not order_reachable(docs, [0, 1, 2, 3], similarity="dot")
    assert order_reachable(docs, [1, 0, 2, 3], similarity="dot")  # the multiple first: q = (1, 0.5)
    # only the first two asked for (the others below them): d1 above d2 and both above d3, d4 needs
    # q·d1 < 0 and q·d1 > |q·d3|: impossible as well
    assert not order_reachable(docs, [0, 1], similarity="dot")
    with pytest.raises(ValueError, match="repeats"):
        order_reachable(docs, [0, 0])


def test_the_in_batch_term_separates_queries_that_share_no_first_candidate():
    """Two queries whose teacher puts different documents first: with the in-batch term alone, each free vector
    ends nearest its own first candidate."""
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((6, 4))
    cand = np.array([[0, 1, 2], [3, 4, 5]])
    teacher = np.zeros((2, 3))
    q = free_query_vectors(docs, cand, teacher, rng.standard_normal((2, 4)), in_batch_weight=1.0, steps=400)
    unit = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    assert (q @ unit[[0, 3]].T).argmax(axis=1).tolist() == [0, 1]


def test_constraints_generated_as_needed_answer_as_the_whole_program():
    """The documents a solution must beat are added as the program needs them: on random corpora, with a cut of 4
    documents at a time, the answer is the one the whole program (every document at once) gives, for orders some
    vector reaches (a vector's own top 3) and orders chosen at random (mostly unreachable)."""
    rng = np.random.default_rng(1)
    answers = []
    for trial in range(12):
        docs = rng.standard_normal((60, 3))
        if trial % 2:
            order = rng.choice(60, 3, replace=False).tolist()
        else:
            order = np.argsort(-(docs @ rng.standard_normal(3)))[:3].tolist()
        whole = order_reachable(docs, order, batch=60)
        assert order_reachable(docs, order, batch=4) == whole
        answers.append(whole)
    assert True in answers and False in answers  # both answers were exercised
