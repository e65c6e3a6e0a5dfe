"""Turning document indices into masked span pairs (COCO), deterministically per (seed, step, document)."""

from __future__ import annotations

import numpy as np
import torch

from ..data.spans import SpanCorpus, continuation_table


class SpanPairBuilder:
    """Builds the model inputs of a COCO step: two spans per document, whole-word masked on the encoded ids.

    The span pair and the mask of document ``d`` at step ``s`` come from a generator seeded by ``(seed, s, d)``:
    a new pair every time the document is drawn, and the same pair after a resume. Output rows are interleaved
    (``2i`` and ``2i+1`` are the two spans of the i-th document), so a span's partner is ``i ^ 1``.
    """

    def __init__(
        self,
        spans: SpanCorpus,
        tokenizer,
        *,
        mlm_probability: float = 0.15,
        max_length: int = 128,
        span_len: int = 64,
        mask: bool = True,
    ):
        self.spans = spans
        self.mask = mask  # False: plain spans and no ``labels`` (contrast-only pretraining computes no MLM)
        self.tok = tokenizer
        self.mlm_probability = mlm_probability
        self.max_length = max_length
        self.span_len = span_len
        self.cont = continuation_table(tokenizer)
        self.cls_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
        self.sep_id = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.mask_id = tokenizer.mask_token_id
        if self.mask_id is None or self.cls_id is None or self.sep_id is None:
            raise ValueError("the tokenizer needs [CLS]/[SEP]/[MASK] (or <s>/</s>/<mask>) tokens for COCO pretraining")
        self.vocab_size = len(tokenizer)
        special = np.zeros(max(self.vocab_size, len(self.cont)), dtype=bool)
        special[[i for i in tokenizer.all_special_ids if i < len(special)]] = True
        self.normal_ids = np.nonzero(~special[: self.vocab_size])[0]

    def mask_span(self, ids: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Whole-word masking of ``ids`` (no special tokens): returns (input ids, labels with -100)."""
        n = len(ids)
        labels = np.full(n, -100, dtype=np.int64)
        out = ids.astype(np.int64).copy()
        if n == 0:
            return out, labels
        cont = self.cont[np.clip(ids, 0, len(self.cont) - 1)]
        starts = np.flatnonzero(~cont)
        if len(starts) == 0 or starts[0] != 0:
            starts = np.concatenate([[0], starts])
        ends = np.append(starts[1:], n)
        target = max(1, int(round(n * self.mlm_probability)))
        chosen = []
        covered = 0
        for w in rng.permutation(len(starts)):
            size = ends[w] - starts[w]
            if covered + size > target and covered > 0:
                continue
            chosen.append(w)
            covered += size
            if covered >= target:
                break
        pos = np.concatenate([np.arange(starts[w], ends[w]) for w in chosen])
        labels[pos] = ids[pos]
        r = rng.random(len(pos))
        out[pos[r < 0.8]] = self.mask_id
        rand_pos = pos[(r >= 0.8) & (r < 0.9)]
        out[rand_pos] = rng.choice(self.normal_ids, len(rand_pos))
        return out, labels

    def build(self, docs, *, step: int, seed: int) -> dict[str, torch.Tensor]:
        rows_ids, rows_labels = [], []
        body = self.max_length - 2
        for d in np.asarray(docs, dtype=np.int64).tolist():
            rng = np.random.default_rng([seed, step, d])
            for span in self.spans.sample_pair(d, rng, self.span_len):
                ids = np.asarray(span[:body], dtype=np.int64)
                labels = np.full(len(ids), -100, dtype=np.int64)
                if self.mask:
                    ids, labels = self.mask_span(ids, rng)
                rows_ids.append(np.concatenate([[self.cls_id], ids, [self.sep_id]]))
                rows_labels.append(np.concatenate([[-100], labels, [-100]]))
        width = max(len(r) for r in rows_ids)
        input_ids = torch.full((len(rows_ids), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows_ids), width), -100, dtype=torch.long)
        attention = torch.zeros((len(rows_ids), width), dtype=torch.long)
        for i, (ids, lab) in enumerate(zip(rows_ids, rows_labels)):
            input_ids[i, : len(ids)] = torch.from_numpy(ids)
            labels[i, : len(lab)] = torch.from_numpy(lab)
            attention[i, : len(ids)] = 1
        out = {"input_ids": input_ids, "attention_mask": attention}
        if self.mask:
            out["labels"] = labels
        return out
