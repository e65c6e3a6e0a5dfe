"""What any query vector could do against frozen document vectors: the ceiling of query-side distillation.

Query-side distillation (:class:`~hf_cocodr.finetuning.losses.QuerySideDistillLoss`) moves only the query encoder;
the documents keep the starting model's vectors. Two questions tell whether that frozen side caps the student:

- :func:`order_reachable`: is there any query vector whose ranking puts the teacher's top ``k`` first, in the
  teacher's order? Exactly: a linear program over the strict inequalities the order asks for (each candidate scores
  above the next, the last above every other document); for a cosine model the documents are the normalised vectors
  (a query vector's length scales every score alike, so the order is the dot product's).
- :func:`free_query_vectors`: the best vectors the distillation's own loss can find, one free vector per query
  optimised directly (no encoder in between): the listwise KL to the teacher's scores over its ``k`` candidates
  at the student's temperature, plus the in-batch contrast on each query's first candidate against every other
  query's first candidate. Ranking the corpus with them and scoring that ranking with labels gives the ceiling a
  query encoder cannot pass.
"""

from __future__ import annotations

import numpy as np

__all__ = ["free_query_vectors", "order_reachable"]


def _as_documents(doc_vectors, similarity: str) -> np.ndarray:
    d = np.asarray(doc_vectors, np.float64)
    if similarity == "cosine":
        norms = np.linalg.norm(d, axis=1, keepdims=True)
        d = d / np.where(norms > 0, norms, 1.0)
    elif similarity != "dot":
        raise ValueError(f"similarity must be 'cosine' or 'dot', got {similarity!r}")
    return d


def order_reachable(doc_vectors, order, *, similarity: str = "dot", tolerance: float = 1e-9, batch: int = 256) -> bool:
    """Whether some query vector ranks the documents ``order`` (rows of ``doc_vectors``, best first) above every
    other document, in that order, with every inequality strict. Solved exactly as a linear program: maximise ``t``
    subject to ``(d_i − d_j) · q ≥ t`` for each pair the order asks for and ``−1 ≤ q ≤ 1``; reachable iff ``t > 0``.
    The constraints against the other documents are generated as needed: the program is solved with the ``batch``
    documents that score highest against the current solution, and again with those it violates, until none is (a
    subset that is infeasible already answers no)."""
    from scipy.optimize import linprog

    d = _as_documents(doc_vectors, similarity)
    order = [int(i) for i in order]
    if len(set(order)) != len(order):
        raise ValueError("order_reachable: the order repeats a document")
    rest = np.setdiff1d(np.arange(len(d)), order)
    chain = [d[a] - d[b] for a, b in zip(order, order[1:])]
    if not order or (not chain and not len(rest)):
        return True
    last = d[order[-1]]
    # the first cut: the documents nearest the candidates' mean (those a solution has to beat first)
    active = rest[np.argsort(-(d[rest] @ d[order].mean(axis=0)), kind="stable")[:batch]] if len(rest) else rest
    dim = d.shape[1]
    while True:
        diffs = np.asarray(chain + list(last - d[active]))
        a_ub = np.hstack([-diffs, np.ones((len(diffs), 1))])  # -diffs q + t <= 0
        res = linprog(
            c=np.r_[np.zeros(dim), -1.0],
            A_ub=a_ub,
            b_ub=np.zeros(len(diffs)),
            bounds=[(-1.0, 1.0)] * dim + [(None, 1.0)],
            method="highs",
        )
        if res.status != 0 or -res.fun <= tolerance:
            return False
        q, t = res.x[:dim], -res.fun
        margins = (last - d[rest]) @ q
        if (margins > tolerance).all():  # q ranks the order above every other document, strictly
            return True
        violated = rest[margins < t - 1e-12]
        violated = np.setdiff1d(violated, active)
        if not len(violated):
            return True
        worst = violated[np.argsort(((last - d[violated]) @ q), kind="stable")[:batch]]
        active = np.concatenate([active, worst])


def free_query_vectors(
    doc_vectors,
    candidates,
    teacher_scores,
    init,
    *,
    similarity: str = "cosine",
    temperature: float = 0.05,
    teacher_temperature: float = 1.0,
    in_batch_weight: float = 1.0,
    steps: int = 300,
    lr: float = 0.05,
) -> np.ndarray:
    """One free vector per query, optimised (Adam, ``steps`` full-batch steps from ``init``) for the distillation's
    loss against the frozen ``doc_vectors``: KL(softmax(teacher / T_t) ‖ softmax(s / T_s)) over each query's
    ``candidates`` (``(n, k)`` rows of ``doc_vectors``, the teacher's top ``k``, best first, with their
    ``teacher_scores``), plus ``in_batch_weight`` × the contrast of each query's first candidate against the other
    queries' first candidates. ``s`` is the model's similarity (cosine: of the normalised vectors). Returns the
    ``(n, d)`` vectors (normalised for a cosine model)."""
    import torch

    docs = torch.as_tensor(_as_documents(doc_vectors, similarity), dtype=torch.float32)
    cand = torch.as_tensor(np.asarray(candidates), dtype=torch.long)
    target = torch.softmax(torch.as_tensor(np.asarray(teacher_scores), dtype=torch.float32) / teacher_temperature, -1)
    q = torch.nn.Parameter(torch.as_tensor(np.asarray(init), dtype=torch.float32).clone())
    opt = torch.optim.Adam([q], lr=lr)
    firsts = docs[cand[:, 0]]
    labels = torch.arange(len(cand))
    for _ in range(steps):
        opt.zero_grad()
        v = torch.nn.functional.normalize(q, dim=-1) if similarity == "cosine" else q
        s = torch.einsum("nd,nkd->nk", v, docs[cand]) / temperature
        loss = torch.nn.functional.kl_div(torch.log_softmax(s, -1), target, reduction="batchmean")
        if in_batch_weight:
            loss = loss + in_batch_weight * torch.nn.functional.cross_entropy(v @ firsts.T / temperature, labels)
        loss.backward()
        opt.step()
    with torch.no_grad():
        out = torch.nn.functional.normalize(q, dim=-1) if similarity == "cosine" else q
    return out.detach().numpy()
