"""Alignment and uniformity of an encoder (Wang & Isola, ICML 2020), on span pairs of a corpus (COCO-DR Fig. 5b).

alignment  = E_(x,y)~pos ||f(x) − f(y)||²          (lower: the two spans of a document map close together)
uniformity = log E_(x,y)~data exp(−2 ||f(x) − f(y)||²)  (lower: embeddings spread over the sphere)

Embeddings are L2-normalised, as in the paper; positive pairs are two distinct spans of the same document.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..data.spans import SpanCorpus


def span_pairs(
    texts: Sequence[str], tokenizer, *, max_pairs: int = 2000, seed: int = 0, span_max_tokens: int = 30
) -> list[tuple[str, str]]:
    """Two distinct sentence-group spans from each document (documents with fewer than two are skipped)."""
    from datasets import Dataset

    spans = SpanCorpus.build(
        [Dataset.from_dict({"text": list(texts)})], tokenizer, span_max_tokens=span_max_tokens, seed=seed, cache=False
    )
    rng = np.random.default_rng(seed)
    docs = rng.permutation(len(spans))[:max_pairs]
    pairs = []
    for d in docs:
        a, b = spans.sample_pair(int(d), rng, 64)
        pairs.append((tokenizer.decode(a), tokenizer.decode(b)))
    return pairs


def alignment_uniformity(
    model,
    texts: Sequence[str] | None = None,
    *,
    pairs: Sequence[tuple[str, str]] | None = None,
    max_pairs: int = 2000,
    batch_size: int = 64,
    seed: int = 0,
) -> dict[str, float]:
    """Alignment and uniformity of ``model`` on span pairs built from ``texts`` (or on the given ``pairs``).

    Args:
        model: a SentenceTransformer (its own pooling; embeddings are normalised here).
        texts: documents; two spans of each become a positive pair.
        pairs: ready-made positive pairs instead of ``texts``.
    """
    if pairs is None:
        if texts is None:
            raise ValueError("pass texts (documents) or pairs")
        pairs = span_pairs(texts, model.tokenizer, max_pairs=max_pairs, seed=seed)
    if len(pairs) < 2:
        raise ValueError("need at least two span pairs (documents with two or more sentences)")
    left = (
        model.encode_document(
            [a for a, _ in pairs],
            batch_size=batch_size,
            convert_to_tensor=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        .float()
        .cpu()
    )
    right = (
        model.encode_document(
            [b for _, b in pairs],
            batch_size=batch_size,
            convert_to_tensor=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        .float()
        .cpu()
    )
    return alignment_uniformity_from_embeddings(left, right)


def alignment_uniformity_from_embeddings(left: torch.Tensor, right: torch.Tensor) -> dict[str, float]:
    """The two statistics from normalised embeddings of positive pairs ``(left[i], right[i])``."""
    align = (left - right).norm(dim=1).pow(2).mean()
    x = torch.cat([left, right])
    sq = torch.pdist(x).pow(2)
    uniform = torch.logsumexp(-2 * sq, 0) - np.log(sq.numel())
    return {"alignment": float(align), "uniformity": float(uniform), "num_pairs": int(left.shape[0])}
