"""BERM (Xu et al., ACL 2023): balanced and extractable representations for matching.

Each positive passage is split into sentence units (offline splitter). After the forward pass, a unit's embedding
``e_i`` is the mean of its token states (units are located in the *encoded* tokens through the tokenizer's offset
mapping, so truncation simply drops or shortens trailing units). With ``t_p`` the passage and ``t_q`` the query
embedding:

* unit balance:     L_balance = KL(uniform ‖ softmax_i(t_p · e_i))
* unit extraction:  m = GELU(t_q ⊙ t_p),  L_extract = CE over units of (m · e_i) against the essential unit,
  the unit with the highest BM25 score for the query (a real BM25: corpus-level IDF, length-normalised TF;
  one softmax, not two).

L = L_retrieval + α·L_extract + β·L_balance (α = 0.1, β = 1.0). The logged ``berm_extract_loss`` and
``berm_balance_loss`` are the weighted terms (α·L_extract, β·L_balance) that enter the total. Passages with a single
unit (no sentence boundary, or truncation left one) have nothing to balance or extract: they are left out of both
terms and counted (``berm_single_unit_passages`` in the logs, ``last_stats``). Training only; no inference cost.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.spans import split_sentences_regex
from .base import Method, check_number

logger = logging.getLogger(__name__)

CITATION = {
    "title": "BERM: Training the Balanced and Extractable Representation for Matching to Improve Generalization "
    "Ability of Dense Retrieval",
    "bibtex": """@inproceedings{xu2023berm,
  title = {{BERM}: Training the Balanced and Extractable Representation for Matching to Improve Generalization Ability of Dense Retrieval},
  author = {Xu, Shicheng and Pang, Liang and Shen, Huawei and Cheng, Xueqi},
  booktitle = {Proceedings of the 61st Annual Meeting of the Association for Computational Linguistics},
  year = {2023},
  url = {https://arxiv.org/abs/2305.11052}
}""",
}


@dataclass
class BERMSettings:
    """BERM's training arguments (fields of :class:`~hf_cocodr.IDROTrainingArguments`).

    Args:
        berm_alpha / berm_beta: weights of BERM's extraction and balance losses.
    """

    berm_alpha: float = field(default=0.1, metadata={"help": "BERM: weight of the unit-extraction loss"})
    berm_beta: float = field(default=1.0, metadata={"help": "BERM: weight of the unit-balance loss"})

    def check(self) -> None:
        """ConfigError for a setting out of range, by name (IDROTrainingArguments calls ``Settings.check(args)``)."""
        for name in ("berm_alpha", "berm_beta"):
            check_number(self, name, positive=False)


class BM25Scorer:
    """Okapi BM25 of a query against arbitrary short texts, with IDF from a reference corpus (bm25s tokenisation)."""

    def __init__(self, corpus_texts: Sequence[str], k1: float = 1.2, b: float = 0.75):
        import bm25s
        import Stemmer

        self.stemmer = Stemmer.Stemmer("english")
        self._bm25s = bm25s
        self.k1, self.b = k1, b
        df: Counter = Counter()
        lengths = []
        for toks in self.tokenize(list(corpus_texts)):
            df.update(set(toks))
            lengths.append(len(toks))
        self.n = max(1, len(lengths))
        self.idf = {t: math.log(1 + (self.n - d + 0.5) / (d + 0.5)) for t, d in df.items()}
        self.default_idf = math.log(1 + (self.n + 0.5) / 0.5)

    def tokenize(self, texts: list[str]) -> list[list[str]]:
        out = self._bm25s.tokenize(texts, stopwords="en", stemmer=self.stemmer, return_ids=False, show_progress=False)
        return [list(t) for t in out]

    def scores(self, query: str, units: list[str]) -> np.ndarray:
        """BM25(query, unit_i); unit lengths are normalised by the mean unit length of this passage."""
        q = self.tokenize([query])[0]
        toks = self.tokenize(units)
        avg = max(1e-9, float(np.mean([len(t) for t in toks])) if toks else 1.0)
        out = np.zeros(len(units))
        for i, t in enumerate(toks):
            tf = Counter(t)
            norm = self.k1 * (1 - self.b + self.b * len(t) / avg)
            out[i] = sum(
                self.idf.get(w, self.default_idf) * tf[w] * (self.k1 + 1) / (tf[w] + norm) for w in set(q) if tf[w]
            )
        return out


def balance_loss(unit_logits: Tensor) -> Tensor:
    """KL(uniform ‖ softmax(logits)) for one passage; 0 when all units score equally."""
    n = unit_logits.shape[0]
    return -math.log(n) - F.log_softmax(unit_logits, dim=0).mean()


def extraction_loss(m: Tensor, units: Tensor, essential: int) -> Tensor:
    """Cross-entropy (a single softmax) of m·e_i over the units against the essential unit."""
    return F.cross_entropy((units @ m)[None, :], torch.tensor([essential], device=units.device))


class BERMObjective(nn.Module):
    """The BERM terms of :class:`~hf_cocodr.IDROLoss` (pass it in ``auxiliary=[...]``).

    Args:
        tokenizer: the model's tokenizer (for the offset mapping of the positive passages).
        corpus_texts: texts for the BM25 IDF statistics (the training corpus).
        alpha / beta: weights of L_extract and L_balance.
        max_length: the token limit the positives are encoded with.
    """

    name = "berm"
    needs_token_states = True

    def __init__(
        self,
        tokenizer,
        corpus_texts: Sequence[str],
        *,
        alpha: float = 0.1,
        beta: float = 1.0,
        max_length: int | None = None,
    ):
        super().__init__()
        if alpha < 0 or beta < 0:
            raise ValueError("BERM weights alpha and beta must be >= 0")
        self.tokenizer = tokenizer
        self.alpha, self.beta = alpha, beta
        self.max_length = max_length
        self.bm25 = BM25Scorer(corpus_texts)
        self.last_stats: dict = {}

    def unit_token_spans(self, text: str, input_ids: Tensor) -> list[tuple[int, int]]:
        """Token ranges ``[a, b)`` (positions in ``input_ids``) of the sentence units of ``text``."""
        enc = self.tokenizer(
            text,
            return_offsets_mapping=True,
            truncation=True,
            max_length=int(input_ids.shape[0]) if self.max_length is None else self.max_length,
        )
        n = int(input_ids.shape[0])
        ids = enc["input_ids"][:n]
        if list(ids) != input_ids[: len(ids)].tolist():
            raise RuntimeError(
                f"BERM: re-tokenising the passage gave {list(ids)[:8]}..., the batch holds "
                f"{input_ids[:8].tolist()}...; the positive column must be encoded from these texts"
            )
        offsets = enc["offset_mapping"][: len(ids)]
        spans, start = [], 0
        for sent in split_sentences_regex(text):
            begin = text.find(sent, start)
            if begin < 0:
                continue
            end = begin + len(sent)
            start = end
            toks = [i for i, (a, b) in enumerate(offsets) if b > a and a >= begin and b <= end]
            if toks:
                spans.append((toks[0], toks[-1] + 1))
        return spans

    def compute(self, model, embeddings: list[Tensor], outputs, context: dict) -> dict[str, Tensor]:
        texts = context.get("texts")
        if not texts:
            raise ValueError("BERM needs the batch texts (train it with IDROTrainer)")
        return self(embeddings[0], embeddings[1], outputs[1], texts[0], texts[1])

    def forward(
        self, queries: Tensor, passages: Tensor, passage_out: dict, texts_q: list[str], texts_p: list[str]
    ) -> dict[str, Tensor]:
        tokens = passage_out["token_embeddings"]
        ids = passage_out["input_ids"]
        bal, ext, single = [], [], 0
        for b, (q_text, p_text) in enumerate(zip(texts_q, texts_p)):
            spans = self.unit_token_spans(p_text, ids[b])
            if len(spans) < 2:
                single += 1
                continue
            units = torch.stack([tokens[b, a:e].mean(0) for a, e in spans])
            bal.append(balance_loss(units @ passages[b]))
            unit_texts = [self.tokenizer.decode(ids[b, a:e]) for a, e in spans]
            essential = int(np.argmax(self.bm25.scores(q_text, unit_texts)))
            m = F.gelu(queries[b] * passages[b])
            ext.append(extraction_loss(m, units, essential))
        zero = queries.sum() * 0.0
        l_bal = torch.stack(bal).mean() if bal else zero
        l_ext = torch.stack(ext).mean() if ext else zero
        self.last_stats = {"single_unit_passages": single, "passages": len(texts_p)}
        return {
            "berm_extract_loss": self.alpha * l_ext,
            "berm_balance_loss": self.beta * l_bal,
            "_berm_single_unit_passages": torch.tensor(float(single)),
        }


class BERM(Method):
    """BERM as a method of :class:`~hf_cocodr.IDROTrainer`: one :class:`BERMObjective` loss term (BM25 statistics
    from the training corpus); training only, it leaves the saved model as it is."""

    name = "berm"
    label = "BERM"
    display_name = "BERM (balanced and extractable representations for matching)"
    citation = CITATION
    settings = BERMSettings

    def __init__(self, settings: BERMSettings | None = None, objective: BERMObjective | None = None):
        super().__init__(settings or BERMSettings())
        self.objective = objective

    @classmethod
    def build(cls, model, args, data, *, target_corpora=(), target_queries=(), **overrides) -> BERM:
        cfg = cls.settings_from(args, **overrides)
        objective = BERMObjective(
            model.tokenizer,
            data.corpus_text_list(),
            alpha=cfg.berm_alpha,
            beta=cfg.berm_beta,
            max_length=args.max_length,
        )
        return cls(cfg, objective)

    def loss_terms(self) -> list:
        return [self.objective] if self.objective is not None else []

    def stage_info(self, args) -> dict[str, str]:
        return {"BERM": f"extraction weight α={self.config.berm_alpha:g}, balance weight β={self.config.berm_beta:g}"}
