"""Training rows for retrieval fine-tuning: queries, their labelled positives, and a refreshable negatives table.

:class:`RetrievalTrainingData` is what :class:`~hf_cocodr.IDROTrainer` trains on. Rows are queries (one row per
query, so a batch never holds the same query twice). Each time a row is drawn, one of its positives and its
hard negatives are sampled with a generator seeded by ``(seed, global_step, row)``, so a resumed run draws
exactly what the uninterrupted run drew. Negatives never include a labelled positive of the query.

:class:`StaticRows` wraps an ordinary sentence-transformers dataset (``anchor, positive[, negative...]``
columns) so the same trainer also accepts it (negatives then cannot be refreshed).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .beir import BEIRData, BEIRFormatError, column_numpy, doc_text, load_beir

logger = logging.getLogger(__name__)


def _csr(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    idx = np.fromiter((i for x in lists for i in x), dtype=np.int64, count=int(ptr[-1]))
    return ptr, idx


class RowsSource:
    """What :class:`~hf_cocodr.IDROTrainer` samples training rows from.

    A rows source has ``len()``, ``sample(rows, step=, seed=, num_negatives=)`` (the text columns of those rows,
    their document keys and positive keys), ``query_texts``, ``name``, ``negatives_source`` and
    ``state_tensors()`` / ``load_state_tensors(tensors, source)`` for checkpoints. A method that builds training
    rows of its own (several groups of rows, say) subclasses it and says which of its rows hold a negatives table
    (:meth:`negatives_table`) and which row group those rows are trained as (:attr:`negatives_group`), so the
    trainer and the negatives refresh reach them without knowing the method.
    """

    negatives_group: str | None = None  # the row group of negatives_table()'s rows (see Method.use_row_group)

    def row_labels(self, rows) -> np.ndarray | None:
        """Per-row targets the loss reads (a distillation teacher's scores), or None: the rows carry none."""
        return None

    def negatives_table(self) -> RetrievalTrainingData | None:
        """The rows whose negatives come from a corpus (sampled per row, refreshed by self-mining), or None."""
        return None


class RetrievalTrainingData(RowsSource):
    """Queries, their positives (corpus rows) and hard-negative candidates (corpus rows), as CSR arrays.

    Args:
        corpus: a dataset with ``_id``, ``text`` and optionally ``title`` (e.g. ``load_beir(...).corpus``).
        query_ids / query_texts: one entry per training row.
        positives: for each row, the corpus rows of its labelled positives (at least one).
        name: a label for logs and the model card (e.g. ``"squad-v1.1:train"``).
    """

    def __init__(
        self,
        corpus,
        query_ids: Sequence[str],
        query_texts: Sequence[str],
        positives: Sequence[Sequence[int]],
        name: str | None = None,
    ):
        if len(query_ids) == 0:
            raise ValueError(
                f"training data {name or ''} has no queries with a labelled positive; nothing to train on"
            )
        if not (len(query_ids) == len(query_texts) == len(positives)):
            raise ValueError("query_ids, query_texts and positives must have the same length")
        empty = [q for q, p in zip(query_ids, positives) if len(p) == 0]
        if empty:
            raise ValueError(f"{len(empty)} queries have no positive in the corpus, e.g. {empty[:5]}")
        self.corpus = corpus
        self.query_ids = list(query_ids)
        self.query_texts = list(query_texts)
        self.pos_ptr, self.pos_idx = _csr(positives)
        self.neg_ptr = np.zeros(len(self.query_ids) + 1, dtype=np.int64)
        self.neg_idx = np.zeros(0, dtype=np.int64)
        self.negatives_source = "none"
        self.name = name or "training data"
        self.available_queries = len(self.query_ids)
        self.full_corpus_docs = len(corpus)
        self.mining_seconds = 0.0  # BM25 mining and pool restriction, as timed by from_beir
        self._titles = "title" in corpus.column_names

    # ---------------------------------------------------------------------------------------- building
    @classmethod
    def from_beir(
        cls,
        folder: str | os.PathLike | BEIRData,
        split: str = "train",
        *,
        negatives: str = "bm25",
        bm25_top_k: int = 100,
        max_queries: int | None = None,
        seed: int = 0,
        corpus_pool: int | None = None,
    ) -> RetrievalTrainingData:
        """Rows from a BEIR split: every judged query with at least one positive (grade > 0).

        Args:
            negatives: ``"bm25"`` mines warm-up negatives with BM25 over the corpus (top ``bm25_top_k``,
                positives removed); ``"none"`` leaves the table empty (in-batch negatives only).
            max_queries: keep a random subset of this many queries (for quick runs).
            corpus_pool: restrict the corpus to the positives and the BM25 top-``corpus_pool`` documents of the
                kept queries (a mining pool), so self-negative refreshes re-encode only that pool. Needs
                ``negatives="bm25"``.
        """
        for name, value in (("bm25_top_k", bm25_top_k), ("max_queries", max_queries), ("corpus_pool", corpus_pool)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(
                    f"{name} must be a whole number >= 1{'' if name == 'bm25_top_k' else ' (or None)'}, got {value!r}"
                )
        data = folder if isinstance(folder, BEIRData) else load_beir(folder, split)
        row_of = {d: i for i, d in enumerate(column_numpy(data.corpus, "_id").tolist())}
        qtext = dict(zip(column_numpy(data.queries, "_id").tolist(), column_numpy(data.queries, "text").tolist()))
        qids, texts, positives, missing = [], [], [], []
        for qid, judged in data.qrels.items():
            pos = [row_of[d] for d, g in judged.items() if g > 0 and d in row_of]
            if not pos:
                if any(g > 0 for g in judged.values()):
                    missing.append(qid)
                continue
            qids.append(qid)
            texts.append(qtext[qid])
            positives.append(sorted(pos))
        if missing and not qids:
            raise BEIRFormatError(
                f"none of the {len(missing)} judged queries has a positive document with text in the corpus "
                f"(e.g. {missing[:5]}); check that qrels/{split}.tsv and corpus.jsonl belong together.",
                Path(data.folder) / "qrels" / f"{split}.tsv",
            )
        if missing:
            logger.warning(
                "%d queries skipped: their positives have empty text in the corpus (e.g. %s)",
                len(missing),
                missing[:5],
            )
        available = len(qids)
        if max_queries is not None and max_queries < len(qids):
            keep = np.sort(np.random.default_rng(seed).choice(len(qids), max_queries, replace=False))
            qids, texts, positives = [qids[i] for i in keep], [texts[i] for i in keep], [positives[i] for i in keep]
        out = cls(data.corpus, qids, texts, positives, name=f"{Path(data.folder).name}:{split}")
        out.available_queries = available  # judged queries with a positive, before the max_queries draw
        out.full_corpus_docs = len(data.corpus)
        if negatives == "bm25":
            t0 = time.perf_counter()
            out.mine_bm25_negatives(top_k=bm25_top_k)
            if corpus_pool:
                out.restrict_corpus_to_pool(corpus_pool)
            out.mining_seconds = time.perf_counter() - t0
        elif negatives != "none":
            raise ValueError(f"negatives must be 'bm25' or 'none', got {negatives!r}")
        elif corpus_pool:
            raise ValueError("corpus_pool needs negatives='bm25' (the pool is built from the BM25 ranking)")
        logger.info(
            "%s: %d training queries, %.2f positives per query, corpus of %d documents",
            out.name,
            len(out),
            out.pos_idx.size / len(out),
            len(out.corpus),
        )
        return out

    def fingerprint(self) -> dict:
        """A content hash of the queries, their positives and negatives and the corpus (run identity)."""

        h = hashlib.sha256()
        for part in (self.query_ids, self.query_texts):
            h.update("\x1f".join(part).encode())
        for arr in (self.pos_ptr, self.pos_idx, self.neg_ptr, self.neg_idx):
            h.update(np.ascontiguousarray(arr).tobytes())
        h.update(str(getattr(self.corpus, "_fingerprint", len(self.corpus))).encode())
        return {"training_data": h.hexdigest()[:32], "queries": len(self.query_ids)}

    def __len__(self) -> int:
        return len(self.query_ids)

    def negatives_table(self) -> RetrievalTrainingData:
        return self

    def positives(self, row: int) -> np.ndarray:
        return self.pos_idx[self.pos_ptr[row] : self.pos_ptr[row + 1]]

    def negatives(self, row: int) -> np.ndarray:
        return self.neg_idx[self.neg_ptr[row] : self.neg_ptr[row + 1]]

    def corpus_text_list(self) -> list[str]:
        titles = column_numpy(self.corpus, "title") if self._titles else None
        texts = column_numpy(self.corpus, "text")
        return [doc_text(titles[i] if titles is not None else "", texts[i]) for i in range(len(texts))]

    def doc_texts(self, rows: Sequence[int]) -> list[str]:
        b = self.corpus[list(map(int, rows))]
        titles = b.get("title") or [""] * len(rows)
        return [doc_text(t, x) for t, x in zip(titles, b["text"])]

    # ---------------------------------------------------------------------------------------- negatives
    def clean_ranking(
        self, start: int, ranked: np.ndarray, skip_top: int = 0, keep: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised: drop padding and labelled positives from ranked rows ``start..``; keep ranks
        ``[skip_top, skip_top + keep)`` of what is left. Returns (per-row counts, flat candidate rows)."""
        ranked = np.asarray(ranked, dtype=np.int64)
        n, k = ranked.shape
        ok = ranked >= 0
        rows = np.arange(start, start + n)
        widths = self.pos_ptr[rows + 1] - self.pos_ptr[rows]
        for w in np.unique(widths):  # rows with the same number of positives compare in one broadcast
            sel = np.nonzero(widths == w)[0]
            pos = self.pos_idx[self.pos_ptr[rows[sel]][:, None] + np.arange(w)[None, :]]
            ok[sel] &= ~(ranked[sel][:, :, None] == pos[:, None, :]).any(-1)
        rank = np.cumsum(ok, axis=1) - 1
        take = ok & (rank >= skip_top) & ((rank < skip_top + keep) if keep else True)
        return take.sum(1), ranked[take]

    def set_negatives(self, ranked, source: str, skip_top: int = 0, keep: int | None = None) -> None:
        """Install a negatives table from ranked corpus rows per query (labelled positives removed).

        ``ranked`` is an (n_queries × k) array, or an iterable of ``(first_row, block)`` for streaming large tables.
        """
        blocks = (
            [(0, ranked)]
            if isinstance(ranked, np.ndarray)
            or (isinstance(ranked, (list, tuple)) and ranked and not isinstance(ranked[0], tuple))
            else ranked
        )
        counts = np.zeros(len(self), dtype=np.int64)
        flat = []
        for start, block in blocks:
            block = np.asarray(block, dtype=np.int64)
            c, f = self.clean_ranking(start, block, skip_top, keep)
            counts[start : start + len(block)] = c
            flat.append(f)
        self.install_negatives(
            np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            np.concatenate(flat) if flat else np.zeros(0, np.int64),
            source,
        )

    def install_negatives(self, neg_ptr: np.ndarray, neg_idx: np.ndarray, source: str) -> None:
        self.neg_ptr, self.neg_idx = np.asarray(neg_ptr, np.int64), np.asarray(neg_idx, np.int64)
        self.negatives_source = source
        sizes = np.diff(self.neg_ptr)
        logger.info(
            "%s negatives installed: %.1f candidates per query (min %d, %d queries without any)",
            source,
            sizes.mean(),
            sizes.min(),
            int((sizes == 0).sum()),
        )

    def mine_bm25_negatives(self, top_k: int = 100) -> None:
        from ..retrieval.index import BM25Index

        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"bm25_top_k must be a whole number >= 1, got {top_k!r}")

        index = BM25Index(self.corpus_text_list())
        _, idx = index.search(self.query_texts, min(top_k + 20, index.ntotal))
        self.set_negatives(idx, "bm25", keep=top_k)

    def restrict_corpus_to_pool(self, top_k: int) -> None:
        """Keep only the positives and the first ``top_k`` negatives of every query (indices are remapped)."""
        keep = set(self.pos_idx.tolist())
        for r in range(len(self)):
            keep.update(self.negatives(r)[:top_k].tolist())
        rows = np.array(sorted(keep), dtype=np.int64)
        remap = np.full(len(self.corpus), -1, dtype=np.int64)
        remap[rows] = np.arange(len(rows))
        before = len(self.corpus)
        self.corpus = self.corpus.select(rows)
        self.pos_idx = remap[self.pos_idx]
        lists = [[int(x) for x in remap[self.negatives(r)[:top_k]]] for r in range(len(self))]
        self.neg_ptr, self.neg_idx = _csr(lists)
        logger.info(
            "%s: corpus restricted to a mining pool of %d of %d documents (positives + BM25 top-%d)",
            self.name,
            len(rows),
            before,
            top_k,
        )

    # ---------------------------------------------------------------------------------------- sampling
    def sample(self, rows: Sequence[int], *, step: int, seed: int, num_negatives: int):
        """Texts and keys of a batch: ``(columns, doc_keys (B×(1+m)), pos_keys (B×P))``.

        Rows without enough table negatives get random corpus documents that are not their positives.
        """
        n_docs = len(self.corpus)
        queries, pos_rows, neg_rows = [], [], []
        for r in rows:
            r = int(r)
            rng = np.random.default_rng([seed, step, r])
            pos = self.positives(r)
            pos_rows.append(int(pos[rng.integers(len(pos))]))
            queries.append(self.query_texts[r])
            if num_negatives:
                cand = self.negatives(r)
                if len(cand) >= num_negatives:
                    picked = rng.choice(cand, num_negatives, replace=False).tolist()
                else:
                    picked = cand.tolist()
                    banned = set(pos.tolist()) | set(picked)
                    if len(banned) >= n_docs:
                        raise ValueError(
                            f"query {self.query_ids[r]!r}: the corpus has no document left to use as a negative"
                        )
                    while len(picked) < num_negatives:
                        c = int(rng.integers(n_docs))
                        if c not in banned:
                            picked.append(c)
                            banned.add(c)
                neg_rows.append(picked)
        columns = [queries, self.doc_texts(pos_rows)]
        for k in range(num_negatives):
            columns.append(self.doc_texts([n[k] for n in neg_rows]))
        doc_keys = np.array(pos_rows, dtype=np.int64)[:, None]
        if num_negatives:
            doc_keys = np.concatenate([doc_keys, np.array(neg_rows, dtype=np.int64)], axis=1)
        width = max(len(self.positives(int(r))) for r in rows)
        pos_keys = np.full((len(rows), width), -1, dtype=np.int64)
        for i, r in enumerate(rows):
            p = self.positives(int(r))
            pos_keys[i, : len(p)] = p
        return columns, doc_keys, pos_keys

    # ---------------------------------------------------------------------------------------- state
    def state_tensors(self) -> dict[str, np.ndarray]:
        return {"neg_ptr": self.neg_ptr, "neg_idx": self.neg_idx}

    def load_state_tensors(self, tensors: dict[str, np.ndarray], source: str) -> None:
        self.neg_ptr = np.asarray(tensors["neg_ptr"], dtype=np.int64)
        self.neg_idx = np.asarray(tensors["neg_idx"], dtype=np.int64)
        self.negatives_source = source


class StaticRows(RowsSource):
    """Adapter for a plain sentence-transformers dataset: column 0 = query, column 1 = positive, rest = negatives."""

    def __init__(self, dataset, name: str | None = None):
        cols = [c for c in dataset.column_names if c not in ("label", "labels", "score", "scores", "dataset_name")]
        if len(cols) < 2:
            raise ValueError(
                f"the training dataset needs at least two text columns (query, positive); it has {dataset.column_names}"
            )
        if len(dataset) == 0:
            raise ValueError("the training dataset is empty")
        for c in cols:
            feat = dataset.features[c]
            if getattr(feat, "dtype", None) not in ("string", "large_string"):
                raise ValueError(f"column {c!r} must hold text, got {feat}")
        self.dataset = dataset.select_columns(cols)
        self.columns = cols
        # a "label" column of per-row scores (a teacher's, for distillation) is handed to the loss
        self.labels = (
            np.asarray(dataset["label"], dtype=np.float32)
            if "label" in dataset.column_names and isinstance(dataset[0]["label"], list)
            else None
        )
        self.query_texts = list(dataset[cols[0]])
        self.query_ids = [str(i) for i in range(len(dataset))]
        self.name = name or "dataset"
        self.negatives_source = "static" if len(cols) > 2 else "none"

    def fingerprint(self) -> dict:
        return {"dataset": self.dataset._fingerprint, "rows": len(self.dataset)}

    def __len__(self) -> int:
        return len(self.dataset)

    def row_labels(self, rows) -> np.ndarray | None:
        return None if self.labels is None else self.labels[np.asarray(rows, dtype=np.int64)]

    def sample(self, rows, *, step: int, seed: int, num_negatives: int):
        b = self.dataset[[int(r) for r in rows]]
        return [b[c] for c in self.columns], None, None

    def state_tensors(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_tensors(self, tensors, source) -> None:  # nothing to restore
        pass
