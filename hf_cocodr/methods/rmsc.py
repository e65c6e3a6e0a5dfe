"""RMSC: relevance matching and soft domain control tokens.

New special tokens (``k`` per kind, default 1): domain tokens ``[S]`` (source) / ``[T]`` (target) right after
``[CLS]`` and relevance tokens ``[W]`` (weak) / ``[H]`` (human) right before ``[SEP]``. They are placed by the fast
tokenizer's post-processor (a ``TemplateProcessing``), so truncation keeps room for them (they are never cut off)
and the exported model's tokenizer adds ``[T] … [H]`` by itself: a plain ``SentenceTransformer(path).encode(text)``
is correct without the user adding anything.

Training mixes three sets: source human labels (``[S] … [H]``), source weak pairs (``[S] … [W]``) and target weak
pairs (``[T] … [W]``); weak pairs come from a corpus by SCL (two spans of a document) or ICT (a sentence vs. the
rest of its document). Batches never mix combinations (:class:`GroupedBatchSampler`), so in-batch negatives only
come from rows with the same tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from ..data.spans import corpus_source, split_sentences_regex

logger = logging.getLogger(__name__)

KINDS = ("S", "T", "W", "H")
COMBINATIONS = {"source_human": ("S", "H"), "source_weak": ("S", "W"), "target_weak": ("T", "W")}
INFERENCE = ("T", "H")


def token_names(kind: str, k: int) -> list[str]:
    return [f"[{kind}]"] if k == 1 else [f"[{kind}{i}]" for i in range(k)]


def add_rmsc_tokens(model, k: int = 1) -> dict[str, list[int]]:
    """Add the RMSC tokens to the tokenizer and the embedding matrix; returns their ids per kind."""
    tok = model.tokenizer
    names = [n for kind in KINDS for n in token_names(kind, k)]
    new = [n for n in names if n not in tok.get_vocab()]
    if new:
        tok.add_tokens(new, special_tokens=True)  # never split, never lower-cased, skipped by decode
        hf = model[0].model
        hf.resize_token_embeddings(len(tok))
    return {kind: tok.convert_tokens_to_ids(token_names(kind, k)) for kind in KINDS}


def set_rmsc_template(model, domain: str, relevance: str, k: int = 1) -> None:
    """Make the tokenizer produce ``[CLS] <domain tokens> text <relevance tokens> [SEP]``."""
    from tokenizers import processors

    tok = model.tokenizer
    if not getattr(tok, "is_fast", False):
        raise ValueError("RMSC needs a fast tokenizer (its post-processor places the tokens)")
    cls_tok = tok.cls_token or tok.bos_token
    sep_tok = tok.sep_token or tok.eos_token
    if cls_tok is None or sep_tok is None:
        raise ValueError("RMSC needs a tokenizer with [CLS]/[SEP] (or <s>/</s>) tokens")
    d, r = token_names(domain, k), token_names(relevance, k)
    single = " ".join([cls_tok, *d, "$A", *r, sep_tok])
    pair = " ".join([cls_tok, *d, "$A", *r, sep_tok, "$B:1", f"{sep_tok}:1"])
    specials = [(t, tok.convert_tokens_to_ids(t)) for t in dict.fromkeys([cls_tok, sep_tok, *d, *r])]
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                                         special_tokens=specials)
    tok._rmsc_combination = (domain, relevance)


def ict_pairs(texts: Sequence[str], rng: np.random.Generator, max_pairs: int) -> list[tuple[str, str]]:
    """Inverse cloze task: one sentence as the query, the rest of its document as the positive."""
    out = []
    for i in rng.permutation(len(texts)):
        sents = split_sentences_regex(texts[int(i)])
        if len(sents) < 2:
            continue
        j = int(rng.integers(len(sents)))
        out.append((sents[j], " ".join(sents[:j] + sents[j + 1:])))
        if len(out) >= max_pairs:
            break
    return out


def scl_pairs(texts: Sequence[str], rng: np.random.Generator, max_pairs: int) -> list[tuple[str, str]]:
    """Two non-overlapping halves (sentence groups) of the same document."""
    out = []
    for i in rng.permutation(len(texts)):
        sents = split_sentences_regex(texts[int(i)])
        if len(sents) < 2:
            continue
        cut = int(rng.integers(1, len(sents)))
        a, b = " ".join(sents[:cut]), " ".join(sents[cut:])
        out.append((a, b) if rng.random() < 0.5 else (b, a))
        if len(out) >= max_pairs:
            break
    return out


def weak_pairs(corpus, mode: str, max_pairs: int, seed: int = 0) -> list[tuple[str, str]]:
    if mode not in ("scl", "ict"):
        raise ValueError(f"weak pair mode must be 'scl' or 'ict', got {mode!r}")
    src = corpus_source(corpus)
    texts = list(src.texts())
    pairs = (ict_pairs if mode == "ict" else scl_pairs)(texts, np.random.default_rng(seed), max_pairs)
    if not pairs:
        raise ValueError(f"corpus {src.name!r} gives no weak pairs ({mode}): its documents have a single sentence")
    return pairs


class RMSCTrainingData:
    """Source human rows (a RetrievalTrainingData) + source weak pairs + target weak pairs, grouped by combination."""

    def __init__(self, human, source_weak: Sequence[tuple[str, str]], target_weak: Sequence[tuple[str, str]]):
        if not target_weak:
            raise ValueError("RMSC needs target weak pairs (a target corpus)")
        self.human = human
        self.weak = {"source_weak": list(source_weak), "target_weak": list(target_weak)}
        n_h = len(human)
        n_s, n_t = len(self.weak["source_weak"]), len(self.weak["target_weak"])
        self.group_of = np.concatenate([np.zeros(n_h, np.int64), np.ones(n_s, np.int64), np.full(n_t, 2, np.int64)])
        self.groups = ["source_human", "source_weak", "target_weak"]
        self.offsets = [0, n_h, n_h + n_s]
        self.query_texts = list(human.query_texts) + [a for a, _ in self.weak["source_weak"]] + [
            a for a, _ in self.weak["target_weak"]]
        self.query_ids = [f"h{i}" for i in range(n_h)] + [f"w{i}" for i in range(n_s + n_t)]
        self.name = f"RMSC({human.name} + {n_s} source weak + {n_t} target weak)"
        self.negatives_source = f"{human.negatives_source} (human rows); in-batch (weak rows)"
        self.corpus = human.corpus

    def __len__(self) -> int:
        return len(self.group_of)

    def combination(self, rows) -> str:
        groups = set(self.group_of[np.asarray(rows, dtype=np.int64)].tolist())
        if len(groups) != 1:
            raise ValueError("an RMSC batch mixes token combinations; use the GroupedBatchSampler")
        return self.groups[groups.pop()]

    def sample(self, rows, *, step: int, seed: int, num_negatives: int):
        group = self.combination(rows)
        if group == "source_human":
            return self.human.sample(rows, step=step, seed=seed, num_negatives=num_negatives)
        pairs = self.weak[group]
        start = self.offsets[self.groups.index(group)]
        chosen = [pairs[int(r) - start] for r in rows]
        return [[a for a, _ in chosen], [b for _, b in chosen]], None, None

    def state_tensors(self):
        return {f"human_{k}": v for k, v in self.human.state_tensors().items()}

    def load_state_tensors(self, tensors, source):
        self.human.load_state_tensors({k[6:]: v for k, v in tensors.items() if k.startswith("human_")}, source)

    # the negatives refresh works on the human rows only
    def __getattr__(self, item):
        if item in ("pos_ptr", "pos_idx", "neg_ptr", "neg_idx", "positives", "negatives", "clean_ranking",
                    "install_negatives", "doc_texts"):
            return getattr(self.human, item)
        raise AttributeError(item)


class GroupedBatchSampler(torch.utils.data.Sampler):
    """Batches that never mix groups: rows are shuffled within their group, cut into batches, batches shuffled.

    Deterministic per ``(seed, epoch)``; ``drop_last`` drops each group's incomplete batch. With
    ``world_size`` > 1 the rows are cut into *global* batches of ``batch_size × world_size`` and each is yielded as
    ``world_size`` consecutive per-device batches, which is how accelerate deals batches to the ranks (batch ``i``
    to rank ``i mod world_size``): at every step all ranks hold the same combination, so negatives gathered across
    devices never cross combinations, and the rows of a step are those of one process with the global batch.
    """

    def __init__(self, groups: np.ndarray, batch_size: int, drop_last: bool = True, seed: int = 0,
                 world_size: int = 1):
        self.groups = np.asarray(groups)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.seed = seed
        self.world_size = max(1, int(world_size))
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        size = self.batch_size * self.world_size
        global_batches = []
        for g in np.unique(self.groups):
            rows = rng.permutation(np.nonzero(self.groups == g)[0])
            for s in range(0, len(rows), size):
                b = rows[s:s + size]
                if len(b) == size or (not self.drop_last and self.world_size == 1):
                    global_batches.append(b)
        order = rng.permutation(len(global_batches))
        return [global_batches[i][r * self.batch_size:(r + 1) * self.batch_size].tolist()
                for i in order for r in range(self.world_size)]

    def __iter__(self):
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


def finalize_rmsc_model(model, k: int = 1) -> None:
    """Set the inference combination ``[T] … [H]`` (saved with the tokenizer, see :func:`pin_saved_tokenizer`)."""
    set_rmsc_template(model, *INFERENCE, k=k)


def pin_saved_tokenizer(directory) -> None:
    """Make a saved tokenizer load exactly as stored in ``tokenizer.json``.

    Model-specific tokenizer classes (e.g. ``BertTokenizer`` in transformers 5) rebuild their post-processor from
    ``[CLS]``/``[SEP]`` when loaded, which would drop the ``[T] … [H]`` template; the generic
    ``PreTrainedTokenizerFast`` keeps the stored one (normaliser, lower-casing and special tokens included).
    """
    import json
    from pathlib import Path

    from ..utils import atomic_write_json

    root = Path(directory)
    for cfg_path in root.rglob("tokenizer_config.json"):
        inner = cfg_path.relative_to(root).parts[:-1]  # checkpoints inside `directory` are pinned when saved
        if any(p.startswith("checkpoint-") or ".tmp" in p for p in inner):
            continue
        cfg = json.loads(cfg_path.read_text())
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        atomic_write_json(cfg_path, cfg)
