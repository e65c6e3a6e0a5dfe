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

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..data.spans import corpus_source, split_sentences_regex
from ..data.training import RowsSource
from ..errors import ConfigError
from ..retrieval.encoding import encode_texts
from ..utils import atomic_write_json
from .base import Method

logger = logging.getLogger(__name__)

CITATION = {
    "title": "Improving the Generalization Ability of Dense Passage Retrieval via Relevance Matching and "
    "Soft Domain Control (RMSC)",
    "bibtex": """@misc{rmsc,
  title = {Relevance Matching and Soft Domain Control for Zero-Shot Dense Retrieval},
  note = {RMSC: domain tokens [S]/[T] and relevance tokens [W]/[H] prepended/appended to the input}
}""",
}


@dataclass
class RMSCSettings:
    """RMSC's training arguments (fields of :class:`~hf_cocodr.IDROTrainingArguments`).

    Args:
        rmsc_k: soft tokens per kind ([S], [T], [W], [H]).
        rmsc_weak_mode: ``"scl"`` (two halves of a document) or ``"ict"`` (a sentence vs. the rest).
        rmsc_weak_pairs: weak pairs per corpus (None: balanced, as many as the labelled source queries).
    """

    rmsc_k: int = field(default=1, metadata={"help": "RMSC: soft tokens per kind"})
    rmsc_weak_mode: str = field(default="scl", metadata={"help": "RMSC: weak pairs by 'scl' or 'ict'"})
    rmsc_weak_pairs: int | None = field(
        default=None, metadata={"help": "RMSC: weak pairs per corpus (None: as many as labelled source queries)"}
    )

    def check(self) -> None:
        """ConfigError for a setting out of range, by name (IDROTrainingArguments calls ``Settings.check(args)``)."""
        if self.rmsc_k < 1:
            raise ConfigError(f"rmsc_k must be >= 1, got {self.rmsc_k}")
        if self.rmsc_weak_mode not in ("scl", "ict"):
            raise ConfigError(f"rmsc_weak_mode must be 'scl' or 'ict', got {self.rmsc_weak_mode!r}")
        if self.rmsc_weak_pairs is not None and self.rmsc_weak_pairs < 1:
            raise ConfigError(f"rmsc_weak_pairs must be >= 1 (or unset), got {self.rmsc_weak_pairs}")


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
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=specials
    )
    tok._rmsc_combination = (domain, relevance)


def ict_pairs(texts: Sequence[str], rng: np.random.Generator, max_pairs: int) -> list[tuple[str, str]]:
    """Inverse cloze task: one sentence as the query, the rest of its document as the positive."""
    out = []
    for i in rng.permutation(len(texts)):
        sents = split_sentences_regex(texts[int(i)])
        if len(sents) < 2:
            continue
        j = int(rng.integers(len(sents)))
        out.append((sents[j], " ".join(sents[:j] + sents[j + 1 :])))
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


class RMSCTrainingData(RowsSource):
    """Source human rows (a RetrievalTrainingData) + source weak pairs + target weak pairs, grouped by combination.
    The human rows hold the negatives table (a negatives refresh mines them, encoded as ``source_human``)."""

    negatives_group = "source_human"

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
        self.query_texts = (
            list(human.query_texts)
            + [a for a, _ in self.weak["source_weak"]]
            + [a for a, _ in self.weak["target_weak"]]
        )
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

    def negatives_table(self):
        return self.human

    def state_tensors(self):
        return {f"human_{k}": v for k, v in self.human.state_tensors().items()}

    def load_state_tensors(self, tensors, source):
        self.human.load_state_tensors({k[6:]: v for k, v in tensors.items() if k.startswith("human_")}, source)

    # the negatives refresh works on the human rows only
    def __getattr__(self, item):
        if item in (
            "pos_ptr",
            "pos_idx",
            "neg_ptr",
            "neg_idx",
            "positives",
            "negatives",
            "clean_ranking",
            "install_negatives",
            "doc_texts",
        ):
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

    def __init__(
        self, groups: np.ndarray, batch_size: int, drop_last: bool = True, seed: int = 0, world_size: int = 1
    ):
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
                b = rows[s : s + size]
                if len(b) == size or (not self.drop_last and self.world_size == 1):
                    global_batches.append(b)
        order = rng.permutation(len(global_batches))
        return [
            global_batches[i][r * self.batch_size : (r + 1) * self.batch_size].tolist()
            for i in order
            for r in range(self.world_size)
        ]

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
    root = Path(directory)
    for cfg_path in root.rglob("tokenizer_config.json"):
        inner = cfg_path.relative_to(root).parts[:-1]  # checkpoints inside `directory` are pinned when saved
        if any(p.startswith("checkpoint-") or ".tmp" in p for p in inner):
            continue
        cfg = json.loads(cfg_path.read_text())
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        atomic_write_json(cfg_path, cfg)


class RMSC(Method):
    """RMSC as a method of :class:`~hf_cocodr.IDROTrainer`.

    * data: adds the tokens to the model and mixes the source rows with source and target weak pairs
      (:class:`RMSCTrainingData`); batches never mix combinations (:class:`GroupedBatchSampler`) and each batch is
      tokenized with its combination's tokens;
    * clustering encodes each query row with the tokens it is trained with;
    * every saved model (checkpoints too) encodes with ``[T] … [H]`` by itself (:func:`finalize_rmsc_model`,
      :func:`pin_saved_tokenizer`).

    Mixing the three training sets: by default they are balanced: as many source weak pairs as labelled source
    queries (at most 20,000), and the same number of target weak pairs shared evenly by the target corpora
    (``rmsc_weak_pairs`` sets a fixed count per corpus instead).
    """

    name = "rmsc"
    label = "RMSC"
    display_name = "RMSC (relevance matching and soft domain control tokens)"
    citation = CITATION
    settings = RMSCSettings
    reads_target_corpora = True

    def __init__(self, settings: RMSCSettings | None = None, target_corpora=(), seed: int = 0):
        super().__init__(settings or RMSCSettings())
        self.target_corpora = list(target_corpora)
        self.seed = seed
        self.target_corpora_read = [corpus_source(c).name for c in self.target_corpora]

    @property
    def k(self) -> int:
        return self.config.rmsc_k

    @classmethod
    def build(cls, model, args, data, *, target_corpora=(), target_queries=(), **overrides) -> RMSC:
        return cls(cls.settings_from(args, **overrides), target_corpora, seed=args.seed)

    def prepare_data(self, model, data) -> RMSCTrainingData:
        """Add the tokens to ``model``; the source rows of ``data`` plus source and target weak pairs."""
        if not self.target_corpora:
            raise ConfigError("RMSC needs a target stream (the target corpora)")
        add_rmsc_tokens(model, k=self.k)
        per_corpus = self.config.rmsc_weak_pairs
        n_source = per_corpus or min(20_000, len(data))
        n_target = per_corpus or max(1, -(-n_source // len(self.target_corpora)))
        mode = self.config.rmsc_weak_mode
        source_weak = weak_pairs(data.corpus, mode, n_source, seed=self.seed)
        target_weak = [
            p for i, c in enumerate(self.target_corpora) for p in weak_pairs(c, mode, n_target, seed=self.seed + 1 + i)
        ]
        return RMSCTrainingData(data, source_weak, target_weak)

    # ------------------------------------------------------------------------------------------ training
    def use_row_group(self, trainer, group: str) -> None:
        """The tokenizer adds the tokens of ``group`` (``source_human``, ``source_weak``, ``target_weak``)."""
        set_rmsc_template(trainer.model, *COMBINATIONS[group], k=self.k)

    def before_batch(self, trainer, rows) -> None:
        """This batch's domain/relevance tokens (batches never mix combinations)."""
        self.use_row_group(trainer, trainer.training_data.combination(rows))

    def batch_sampler(self, trainer, dataset, batch_size: int, seed: int):
        groups = getattr(trainer.training_data, "group_of", None)
        if groups is None or len(dataset) != len(groups):
            return None
        return GroupedBatchSampler(
            groups, batch_size, drop_last=True, seed=seed, world_size=max(1, trainer.args.world_size)
        )

    def encode_query_rows(self, trainer, lo: int, hi: int, batch_size: int):
        """Each row encoded with its own combination's tokens, not whatever the last batch left in the tokenizer."""
        data = trainer.training_data
        groups = getattr(data, "group_of", None)
        if groups is None:
            return None
        g = np.asarray(groups[lo:hi])
        cuts = [0, *(np.flatnonzero(np.diff(g)) + 1).tolist(), len(g)]
        parts = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            if b > a:
                self.use_row_group(trainer, data.groups[int(g[a])])
                parts.append(
                    encode_texts(trainer.model, data.query_texts[lo + a : lo + b], kind="query", batch_size=batch_size)
                )
        return np.concatenate(parts) if parts else np.zeros((0, trainer.model.get_embedding_dimension()), np.float32)

    # ------------------------------------------------------------------------------------------ saved models
    def before_save(self, trainer) -> None:
        """The model encodes with ``[T] … [H]`` (the next batch sets its own tokens again)."""
        finalize_rmsc_model(trainer.model, self.k)

    def after_save(self, trainer, output_dir: str) -> None:
        pin_saved_tokenizer(output_dir)

    def stage_info(self, args) -> dict[str, str]:
        c = self.config
        return {
            "RMSC": f"{c.rmsc_k} token(s) per kind, weak pairs by {c.rmsc_weak_mode.upper()}, "
            f"{c.rmsc_weak_pairs or 'balanced'} per corpus; inference with [T] … [H]"
        }
