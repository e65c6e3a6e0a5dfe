"""The recipe's distillation stage (:class:`DistillStage`): the hybrid teacher's ranking distilled into the dense
model on unlabelled target queries.

The teacher is :class:`~hf_cocodr.retrieval.hybrid.HybridRetriever` of the *starting* model and BM25 over the target corpus
the queries belong to (:func:`~hf_cocodr.data.teacher.route_queries`); for each query its top ``distill_k``
documents and fused scores are the training row (:class:`~hf_cocodr.data.teacher.TeacherRows`), and the student
(the model the stages before left behind) learns the teacher's score distribution over them with
:class:`~hf_cocodr.finetuning.DistillationTrainer`'s loss (:class:`~hf_cocodr.finetuning.losses.HybridDistillLoss`:
listwise KL, plus the in-batch contrast on the teacher's first candidate). The query labels are never read. The
teacher's indexes are cached per model and corpus (``<cache>/teacher``), so a resumed or repeated run encodes only
the queries again.

The loss holds its settings (as sentence-transformers' losses do): the options of :data:`LOSS_OPTIONS` are the
settings of the loss the stage builds (:func:`loss_settings`); the ``distill:`` mapping holds the fields of
:class:`~hf_cocodr.finetuning.DistillationTrainingArguments`, training settings only. The stage's identity is derived
from the loss and the arguments by one helper (:func:`distill_identity`).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ...errors import ConfigError
from ...modeling.asymmetric import query_side_model
from ...modeling.loading import load_encoder
from ...utils import native_bf16, preserved_rng_state
from ..checks import DISTILL_BATCH_SIZE
from ..queries import distill_sources
from ..settings import (
    AUTO,
    Auto,
    check_flag,
    check_number,
    check_switch,
    check_whole,
    device_batch_size,
    encode_batch_size,
    option,
)
from ..stage import Cost, Stage, run_arguments, trajectory

if TYPE_CHECKING:
    from ...data.teacher import TeacherRows
    from ..config import RecipeConfig
    from ..context import RecipeRun
    from ..plan import Plan

logger = logging.getLogger("hf_cocodr.recipe.distill")

# the distillation's cap on passes over the queries: the pseudo-queries of the corpus alone and the paper schedule's
# (DISTILL_MAX_PASSES), and the user's --target-queries (QUERIES_MAX_PASSES; docs/adaptation.md links the study)
DISTILL_MAX_PASSES = 3.0
QUERIES_MAX_PASSES = 5.0
# the distillation's learning rate unless the distill mapping sets one (docs/adaptation.md links the study)
DISTILL_LEARNING_RATE = 5e-5
MAX_DISTILL_K = 64  # the candidates are the rows' document columns
DISTILL_SIDES = ("auto", "full", "query")  # what the distillation trains (distill_side; auto: resolve_distill_side)
DISTILL_GPU_BATCH_CAP = 64  # the most queries a step by default on a GPU (device_batch_size)
MIN_STEPS_A_PASS = 8  # a GPU's larger default batch leaves at least this many steps a pass over the queries
PROBE_DOCS = 128  # the documents the probe encodes to time the teacher's encoding of the corpora
# The recipe options that are settings of the distillation's loss: option -> the loss's setting
# (hf_cocodr.finetuning.losses.distill.HybridDistillLoss)
LOSS_OPTIONS = {
    "distill_teacher_temperature": "teacher_temperature",
    "distill_in_batch_weight": "in_batch_weight",
    "distill_document_gradients": "document_gradients",
}
# The loss's settings the stage's identity has named since its first version, whatever their value, by the names it
# gives them (any other setting is named where it differs from the loss's default)
IDENTITY_NAMES = {"teacher_temperature": "teacher_temperature", "in_batch_weight": "in_batch"}
# The stage's identity before its arguments were DistillationTrainingArguments' alone: they held iDRO's
# ``idro_preset``, which it never read. Kept in the identity, so a stage finished then is still skipped on a re-run.
LEGACY_SETTINGS = {"idro_preset": "uniform"}


def spread_sample(corpora: list[list[str]], n: int) -> list[str]:
    """About ``n`` texts drawn evenly through ``corpora`` (each list in proportion to its size, at least one from
    each non-empty one, rows evenly spaced from its first to its last), or all of them where they are fewer."""
    total = sum(len(texts) for texts in corpora)
    if total <= n:
        return [t for texts in corpora for t in texts]
    out: list[str] = []
    for texts in corpora:
        if texts:
            take = max(1, round(n * len(texts) / total))
            step = (len(texts) - 1) / (take - 1) if take > 1 else 0.0
            out += [texts[i] for i in dict.fromkeys(round(j * step) for j in range(take))]
    return out


@dataclass
class DistillSettings:
    """The distillation's options (``distill_*``, ``skip_distill`` and the ``distill`` mapping of
    ``DistillationTrainingArguments`` fields; the options of :data:`LOSS_OPTIONS` are settings of its loss)."""

    training_options: ClassVar[str] = "distill"
    length_options: ClassVar[tuple[str, ...]] = ("max_length",)  # the token lengths among its training arguments

    skip_distill: bool | Auto = option(
        AUTO,
        "leave the distill stage out (true), run it when --target-queries are given (false), or as the schedule "
        "says (auto)",
    )
    distill_steps: int | None = option(None, "steps of the distillation (default: planned, or 500)")
    distill_share: float | Auto = option(AUTO, "the distillation's share of the training budget")
    distill_k: int = option(8, "distillation: the teacher's candidates per query (its top-k)")
    distill_teacher_weight: float | Literal["fit"] | Auto = option(
        AUTO,
        "distillation: the dense weight of the teacher's fusion (1: the starting model alone, 0: BM25 alone), fit: "
        "the fusion fitted to each corpus without labels (the saved hybrid's), or auto: as the schedule says (fit "
        "for a model without an MLM head given --target-queries, 0.5 otherwise)",
    )
    distill_teacher_temperature: float = option(
        1.0, "distillation: temperature of the teacher's (z-normalised, fused) scores"
    )
    distill_in_batch_weight: float = option(
        1.0, "distillation: weight of the in-batch contrastive term on the teacher's first candidate (0: off)"
    )
    distill_document_gradients: bool = option(
        True,
        "distillation: encode the candidates without back-propagating through them (a forward pass only: cheaper "
        "steps; the queries' side of the loss trains the model)",
    )
    distill_side: str = option(
        "auto",
        "distillation: what trains. full: the whole model, its candidates encoded in every step; query: the query "
        "side alone, against the starting model's frozen vectors of the corpus (a step encodes its queries only), "
        "saved as an asymmetric model (a sentence-transformers Router: queries through the adapted encoder, "
        "documents through the starting one, so an index built with the starting model stays valid; a WiSE-FT after "
        "it interpolates the query route alone); auto: query where the distillation starts from the starting model "
        "on a CPU, or trains on pseudo-queries; full otherwise",
    )
    distill_max_passes: float | Auto | None = option(
        AUTO,
        "distillation: at most this many passes over the target queries, however many steps the budget buys "
        "('none': no cap; --distill-steps fixes the steps instead), or auto: as the schedule says (5 where the query "
        "side of a model without an MLM head trains on --target-queries, 3 otherwise)",
        metavar="X|none|auto",
    )
    pseudo_queries: int | Auto = option(
        AUTO,
        "pseudo-queries drawn from the target corpora (split among them by size) for the distillation, beside any "
        "--target-queries: a corpus alone then adapts the model (auto: as the schedule says, docs/adaptation.md)",
        metavar="N|auto",
    )
    pseudo_query_mix: str = option(
        "auto",
        "the kinds of pseudo-queries and their weights, e.g. span:1,keywords:1,title:1 (kinds: span, keywords, "
        "title, ict); auto: the default mix (span:1,keywords:1,title:1)",
    )
    distill: dict[str, Any] = option(
        help="DistillationTrainingArguments fields of the distillation", cli=False, default_factory=dict
    )

    @staticmethod
    def arguments_class() -> type:
        from ...finetuning import DistillationTrainingArguments

        return DistillationTrainingArguments

    def check(self) -> None:
        """Refuse out-of-range distillation options by name."""
        check_number(self, "distill_share", 0, 1)
        if self.distill_teacher_weight not in ("fit", AUTO):
            try:
                check_number(self, "distill_teacher_weight", 0, 1, allow_auto=False)
            except ConfigError as e:
                raise ConfigError(f"{e} (or fit: the fusion fitted to each corpus, or auto)") from None
        check_number(self, "distill_teacher_temperature", 1e-3, 100, allow_auto=False)
        check_number(self, "distill_in_batch_weight", 0, 100, allow_auto=False)
        check_number(self, "distill_max_passes", 0.01, 1000, allow_none=True)
        check_whole(self, "distill_steps", 1, hint="; to leave the stage out set skip_distill: true")
        check_whole(self, "distill_k", 2, allow_none=False)
        if self.distill_k > MAX_DISTILL_K:  # the candidates are the rows' document columns (negative_1 ...)
            raise ConfigError(f"recipe option distill_k must be at most {MAX_DISTILL_K}, got {self.distill_k!r}")
        check_flag(self, "distill_document_gradients")
        if self.distill_side not in DISTILL_SIDES:
            raise ConfigError(
                f"recipe option distill_side must be one of {', '.join(DISTILL_SIDES)}, got {self.distill_side!r}"
            )
        check_switch(self, "skip_distill")
        for key in self.distill if isinstance(self.distill, dict) else ():
            if key in LOSS_OPTIONS:  # (fields of the arguments once: the loss's settings now)
                raise ConfigError(f"recipe option distill.{key}: set the recipe option {key} instead")
        if self.pseudo_queries != AUTO:
            check_whole(self, "pseudo_queries", 0, allow_none=False)
        if self.pseudo_query_mix != "auto":
            from ...retrieval.pseudo_queries import parse_mix

            parse_mix(self.pseudo_query_mix)


def teacher_fusion(cfg: RecipeConfig):
    """The fusion of the distillation's hybrid teacher (a :class:`~hf_cocodr.retrieval.fusion.FusionConfig`):
    ``distill_teacher_weight: fit``, the rule, normalisation and weight fitted to each corpus as the saved hybrid's;
    a number, that dense weight over z-scores of BM25's hits alone over each system's top 100 (the teacher the stage's
    identity has always named; ``bm25_zeros`` and the default depth of 200 came later)."""
    from ...retrieval.fusion import FusionConfig

    if cfg.distill_teacher_weight == AUTO:
        raise ConfigError("recipe option distill_teacher_weight is still auto: resolve the schedule first")
    if cfg.distill_teacher_weight == "fit":
        return FusionConfig()
    return FusionConfig(dense_weight=float(cfg.distill_teacher_weight), normalize="z", bm25_zeros=False, depth=100)


def trained_before(cfg: RecipeConfig, stages) -> list[str]:
    """The labels of the stages of ``stages`` that train before the distillation with ``cfg`` (none: it starts from
    the starting model)."""
    names = [s.name for s in stages]
    end = names.index(DistillStage.name) if DistillStage.name in names else len(stages)
    return [s.label for s in stages[:end] if s.trains and s.enabled(cfg)]


def resolve_distill_side(cfg: RecipeConfig, stages, on_gpu: bool) -> tuple[str, str]:
    """``(side, why)`` for ``distill_side: auto``: ``query`` when the distillation runs, starts from the starting
    model (no training stage before it, :func:`trained_before`), and either the machine has no GPU or the
    distillation trains on pseudo-queries; ``full`` otherwise (why: docs/adaptation.md and the studies it links). A WiSE-FT after it interpolates the query route alone."""
    before = trained_before(cfg, stages)
    pseudo = _pseudo(cfg) > 0
    if on_gpu and not pseudo:
        return "full", "a GPU trains the whole model (the full distillation is the one measured there)"
    if before:
        return "full", f"{', '.join(before)} train(s) the model before the distillation"
    if on_gpu:
        return "query", (
            "it trains on pseudo-queries: a document side trained on them learns what the guard's held-out "
            "pseudo-queries test, so the guard could not vouch for it"
        )
    return "query", "on a CPU the query side buys many more steps (a step encodes its queries only)"


def _check_query_side(cfg: RecipeConfig, trained: str | None) -> None:
    """Refuse ``distill_side: query`` where the distillation would not start from the starting model (``trained``
    says why; its frozen documents are the starting model's vectors)."""
    if trained:
        raise ConfigError(
            "distill_side query trains the query side against the starting model's document vectors, but "
            f"{trained}: switch the stages before it off, or set distill_side full"
        )


def loss_settings(cfg: RecipeConfig) -> dict[str, Any]:
    """The settings of the distillation's loss the options of :data:`LOSS_OPTIONS` give (the student's temperature:
    the loss's default, by the model's similarity)."""
    return {setting: getattr(cfg, option) for option, setting in LOSS_OPTIONS.items()}


def loss_class(cfg: RecipeConfig) -> type:
    """The loss class the stage trains: the query side's (frozen document vectors) or the whole model's."""
    from ...finetuning.losses.distill import HybridDistillLoss, QuerySideDistillLoss

    if cfg.distill_side == AUTO:
        raise ConfigError("recipe option distill_side is still auto: resolve the schedule first")
    return QuerySideDistillLoss if cfg.distill_side == "query" else HybridDistillLoss


def distill_identity(loss: type, settings: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """The loss and the training arguments of the stage's identity, derived from the loss class, its ``settings`` and
    the training ``arguments``: ``loss`` names the settings of :data:`IDENTITY_NAMES` always, every other one where
    it differs from the loss's default, and the loss's ``side`` where it is not the default loss's; ``settings`` the
    training arguments that change what the stage computes (with :data:`LEGACY_SETTINGS`). A setting or a loss added
    later at its default leaves the identity of a run without it unchanged."""
    from ...finetuning.losses.distill import HybridDistillLoss

    defaults = {
        name: p.default
        for name, p in inspect.signature(HybridDistillLoss).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    named = {IDENTITY_NAMES.get(k, k): v for k, v in settings.items() if k in IDENTITY_NAMES or v != defaults.get(k)}
    if loss.side != HybridDistillLoss.side:
        named["side"] = loss.side
    return {"loss": named, "settings": trajectory({**arguments, **LEGACY_SETTINGS})}


def _pseudo(cfg: RecipeConfig) -> int:
    """The pseudo-queries the run draws to train on (0 while the schedule has not resolved ``auto``)."""
    n = cfg.pseudo_queries
    return 0 if n == AUTO or n is None else int(n)


def fit_seconds(num_docs: int, per_doc: float, per_bm25_doc: float, per_query: float) -> float:
    """The seconds of fitting the teacher's fusion to a corpus of ``num_docs`` documents
    (:func:`~hf_cocodr.retrieval.fusion_fit.fit_fusion`), from the probe's per-item times: its pseudo-queries
    (:data:`~hf_cocodr.retrieval.fusion_fit.FIT_PSEUDO_QUERIES`, at most one per document) encoded, as many source
    documents encoded again without the sentence, and a BM25 index of the corpus built again with them. Its
    searches and grid are left out (about a tenth of it)."""
    from ...retrieval.fusion_fit import FIT_PSEUDO_QUERIES

    drawn = min(FIT_PSEUDO_QUERIES, num_docs)
    return drawn * (per_doc + per_query) + num_docs * per_bm25_doc


def pass_cap(rows: int, per_step: int, passes: float | None) -> int | None:
    """The most steps ``passes`` passes over ``rows`` training rows take at ``per_step`` rows a step (a last
    incomplete batch is dropped, as the stage's trainer does; at least 1); None when ``passes`` is None."""
    if passes is None:
        return None
    return max(1, math.floor(passes * (rows // per_step) + 1e-9))


def bf16_by_default(cfg: RecipeConfig) -> bool:
    """Whether the distillation trains under bf16 without being told: where the machine has native bf16 kernels
    (:func:`~hf_cocodr.utils.native_bf16`) and its options set neither ``bf16`` nor ``fp16``."""
    return native_bf16() and "bf16" not in cfg.distill and not cfg.distill.get("fp16")


class DistillStage(Stage):
    """Distillation of the hybrid teacher (the starting model + BM25) on the ``target_queries``: runs when target
    queries are given and ``skip_distill`` is false (the schedule's choice under ``auto``). It trains under bf16
    autocast where the machine has native bf16 kernels (:func:`bf16_by_default`), in fp32 elsewhere;
    ``distill: {bf16: ...}`` (or ``fp16: true``) decides instead. It trains the steps the plan gives it, but at most
    ``distill_max_passes`` passes over the queries (:meth:`steps`). Besides its steps it costs the teacher's
    rankings (encoding the corpus unless the teacher's indexes of it are cached, and the queries)."""

    name = "distill"
    title = "distillation"
    settings = DistillSettings
    share_option = "distill_share"
    reads_target_queries = True

    def __init__(self) -> None:
        self.queries_digest: str | None = None  # the target queries' texts, read once per run
        self.num_queries = 0
        self.per_step: int | None = None  # queries a step: on every rank, every accumulated batch
        self.targets: list | None = None  # the routed target corpora and queries, as the probe reads them

    def enabled(self, cfg: RecipeConfig) -> bool:
        return cfg.skip_distill is False and (bool(cfg.target_queries) or _pseudo(cfg) > 0)

    def cost(
        self,
        throughput: dict[str, float],
        cfg: RecipeConfig,
        *,
        budget_s: float | None = None,
        plan: Plan | None = None,
        **sizes: Any,
    ) -> Cost:
        """Its steps, and the teacher's fixed costs as probed: encoding the corpora (unless the teacher's indexes of
        them are cached), BM25, fitting the teacher's fusion and ranking the queries (``distill_teacher_s``, named
        one by one). The probe times one
        process's encoding; under torch.distributed the ranks share it (:func:`~hf_cocodr.retrieval.encoding.
        encode_sharded`), so its part is divided by the number of ranks."""
        from ...distributed import world

        cost = super().cost(throughput, cfg, budget_s=budget_s, plan=plan)
        cost.fixed_s = throughput.get("distill_teacher_s", 0.0)
        names = ("encode", "bm25", "fit", "check", "rank")
        parts = {
            f"distill_teacher_{n}": throughput[f"distill_teacher_{n}_s"]
            for n in names
            if f"distill_teacher_{n}_s" in throughput
        }
        ranks = world()[0]
        if ranks > 1 and "distill_teacher_encode" in parts:
            shared = parts["distill_teacher_encode"] * (ranks - 1) / ranks
            parts["distill_teacher_encode"] = round(parts["distill_teacher_encode"] / ranks, 4)
            cost.fixed_s = max(0.0, cost.fixed_s - shared)
        cost.parts = parts or ({self.name: round(cost.fixed_s, 2)} if cost.fixed_s else {})
        return cost

    def arguments(self, run: RecipeRun) -> dict[str, Any]:
        cfg = run.cfg
        defaults = dict(
            **run_arguments(run, self.name, logging_steps=5, save_steps=50),
            per_device_train_batch_size=self._batch_size(run),
            learning_rate=DISTILL_LEARNING_RATE,
            warmup_steps=0.1,
            dataloader_drop_last=True,
            max_length=cfg.train_max_length,
        )
        if bf16_by_default(cfg):  # where the machine computes bf16 natively (docs/precision.md)
            defaults["bf16"] = True
        return {**defaults, **cfg.distill}

    def _batch_size(self, run: RecipeRun) -> int:
        """The default queries a step: :data:`DISTILL_BATCH_SIZE` on a CPU; on a GPU larger
        (:func:`~hf_cocodr.recipe.settings.device_batch_size`, at most :data:`DISTILL_GPU_BATCH_CAP`), but leaving at
        least :data:`MIN_STEPS_A_PASS` steps a pass over the target queries."""
        batch = device_batch_size(DISTILL_BATCH_SIZE, DISTILL_GPU_BATCH_CAP)
        if batch > DISTILL_BATCH_SIZE and "per_device_train_batch_size" not in run.cfg.distill:
            self._read_queries(run)
            batch = max(DISTILL_BATCH_SIZE, min(batch, self.num_queries // MIN_STEPS_A_PASS))
        return batch

    def identity(self, run: RecipeRun, start: str) -> dict[str, Any]:
        cfg = run.cfg
        return {
            "stage": self.name,
            "start": start,
            "teacher": {
                "model": run.fps["model"],
                "targets": run.fps["targets"],
                "dense_weight": cfg.distill_teacher_weight,
                "k": cfg.distill_k,
                # the teacher's (and the frozen document side's) vectors are encoded in this precision
                **({"encode_precision": run.encode_precision} if run.encode_precision != "fp32" else {}),
            },
            "queries": self._queries_digest(run),
            **distill_identity(loss_class(cfg), loss_settings(cfg), run.arguments[self.name]),
            "steps": self.steps(run),  # the plan's, or fewer where the cap on passes ends the stage first
        }

    def probe(self, run: RecipeRun) -> dict[str, float]:
        """Seconds of one distillation step (the stage's trainer on rows of its shape: target queries and
        documents, see :meth:`Stage.probe`) and of the teacher's fixed costs, measured on the starting model (the
        teacher): encoding each corpus whose vectors are not cached (neither its teacher's indexes nor the starting
        model's encoding of it, :mod:`~hf_cocodr.retrieval.encoding_cache`), indexing it for BM25 (unless the
        teacher's indexes are cached), fitting the teacher's fusion to it where the teacher is fitted and built
        (:func:`fit_seconds`) and encoding and ranking the queries. ``distill_teacher_s`` is their sum. The
        encoding and BM25 are timed (only where the run pays them) on :data:`PROBE_DOCS` documents spread through
        the corpora they are paid for (:func:`spread_sample`) and scaled to their count."""
        from ...retrieval import encoding_cache
        from ...retrieval.encoding import encode_texts, model_similarity
        from ...retrieval.hybrid import HYBRID_FILE, corpus_fingerprint
        from ...retrieval.index import BM25Index
        from ...retrieval.teacher import teacher_cache_path
        from ..probe import time_trainer_steps

        step_s, trainer = time_trainer_steps(self, run)
        del trainer
        st = load_encoder(run.model)  # the teacher's encoder, as it encodes (not the probe's trained copy)
        st.eval()
        normalize = model_similarity(st) == "cosine"
        queries, to_index, to_encode = [], [], []
        batch = encode_batch_size(run.cfg)  # as the teacher's encoding batches them (its caches are keyed by it)
        for doc_ids, texts, asked in self._targets(run):
            queries += asked
            cached = teacher_cache_path(run.fps["model"], doc_ids, texts, run.encodings, batch_size=batch)
            if (cached / HYBRID_FILE).is_file():
                continue  # the teacher's indexes are cached: the queries alone
            to_index.append(texts)
            key = encoding_cache.encoding_key(
                st,
                None,
                None,
                normalize,
                batch_size=batch,
                session=run.encodings,
                corpus_fp=corpus_fingerprint(doc_ids, texts),
                num_docs=len(texts),
            )
            if encoding_cache.load(key) is None:
                to_encode.append(texts)
        encode_docs, bm25_docs = sum(map(len, to_encode)), sum(map(len, to_index))
        fitted = run.cfg.distill_teacher_weight == "fit"  # each teacher built is fitted to its corpus
        checked = run.cfg.guard != "off"  # the teacher check reads every corpus (one fit's work each)
        all_texts = [texts for _, texts, _ in self._targets(run)]
        # the teacher encodes the documents and queries at the model's own lengths, in the run's corpus-encoding
        # precision (encode_texts: bf16 autocast where the run encodes in bf16); each cost is timed only where the
        # run pays it, on documents spread through the corpora it is paid for (their lengths, not the first rows')
        per_doc = per_bm25_doc = 0.0
        as_run = {"batch_size": batch, "normalize": normalize, "session": run.encodings}
        if encode_docs or (fitted and to_index) or checked:  # (a fit encodes some documents again, cached or not)
            docs = spread_sample(to_encode or to_index or all_texts, PROBE_DOCS if encode_docs else PROBE_DOCS // 4)
            encode_texts(st, docs[:batch], kind="document", **as_run)  # warm-up
            t0 = time.perf_counter()
            encode_texts(st, docs, kind="document", **as_run)
            per_doc = (time.perf_counter() - t0) / len(docs)
        if bm25_docs or checked:
            docs = spread_sample(to_index or all_texts, PROBE_DOCS)
            t0 = time.perf_counter()
            BM25Index(docs)
            per_bm25_doc = (time.perf_counter() - t0) / len(docs)
        asked = queries[:64]
        encode_texts(st, asked[:batch], kind="query", **as_run)  # warm-up
        t0 = time.perf_counter()
        encode_texts(st, asked, kind="query", **as_run)
        per_query = (time.perf_counter() - t0) / len(asked)
        # to the 0.1 ms: a cost the run pays is never recorded as 0 (a small corpus indexes for BM25 in milliseconds)
        parts = {
            "distill_teacher_encode_s": round(per_doc * encode_docs, 4),
            "distill_teacher_bm25_s": round(per_bm25_doc * bm25_docs, 4),
        }
        if fitted and to_index:
            fit_s = sum(fit_seconds(len(texts), per_doc, per_bm25_doc, per_query) for texts in to_index)
            parts["distill_teacher_fit_s"] = round(fit_s, 4)
        if checked:  # the teacher check: a fit's pseudo-queries ranked on every corpus (cached teachers included)
            check_s = sum(fit_seconds(len(texts), per_doc, per_bm25_doc, per_query) for texts in all_texts)
            parts["distill_teacher_check_s"] = round(check_s, 4)
        parts["distill_teacher_rank_s"] = round(per_query * len(queries), 4)
        return {"distill_step_s": step_s, "distill_teacher_s": round(sum(parts.values()), 4), **parts}

    def build_trainer(
        self, run: RecipeRun, max_steps: int, *, output_dir=None, probe: bool = False, rows: TeacherRows | None = None
    ):
        """The stage's :class:`~hf_cocodr.finetuning.DistillationTrainer`: ``run.current`` learns the loss of the
        options (:func:`loss_settings`; the loss class the rows need) on ``rows`` (the teacher's; in a probe, rows of their shape
        drawn from the target queries and documents with random teacher scores, since the teacher's rankings are
        not computed yet)."""
        from ...data.target_queries import read_target_queries
        from ...finetuning import DistillationTrainer, DistillationTrainingArguments
        from ...finetuning.losses.distill import distill_loss

        query_side = self.query_side(run)
        # only the query route trains, against the starting model's vectors of the corpora
        model = query_side_model(load_encoder(run.current)) if query_side else load_encoder(run.current)
        if rows is None:
            rows = self._probe_rows(run, max_steps, model)
        # a Router model is trained with the route of each column named (the rows' one column: the queries)
        forced = {"router_mapping": {"query": "query"}} if query_side else None
        args = self.training_arguments(
            run, DistillationTrainingArguments, max_steps, output_dir=output_dir, probe=probe, forced=forced
        )
        return DistillationTrainer(
            model=model,
            args=args,
            train_dataset=rows,
            loss=distill_loss(model, rows, **loss_settings(run.cfg)),
            card_methods=["hybrid-teacher distillation" + (" (query side)" if query_side else "")],
            negatives_label="the hybrid teacher's candidates",
            # the user's query sources by their own names (the run's query files hold them, and pseudo-queries,
            # which are the corpus's text: the card says so apart)
            target_queries_read=[read_target_queries(q).name for q in run.cfg.target_queries] if rows.sources else [],
            target_corpora_read=[source["corpus"] for source in rows.sources],
        )

    def train(self, run: RecipeRun) -> dict[str, Any] | None:
        from ...retrieval.teacher import distill_dataset, query_side_dataset

        cfg, planned, steps = run.cfg, run.plan.steps_of(self.name), self.steps(run)
        check = self.teacher_check(run) if cfg.guard != "off" else None
        if check is not None and not check["leads"] and cfg.guard == "on":
            logger.warning(
                "distillation: not run, the starting model is kept: %s (guard: record runs it)", check["why"]
            )
            return {"steps": 0, "declined": check["why"], "teacher_check": check}
        t0 = time.perf_counter()
        query_side = self.query_side(run)
        make = query_side_dataset if query_side else distill_dataset
        rows = make(
            run.model,
            run.fps["model"],
            run.target_corpora,
            distill_sources(run),
            cfg.distill_k,
            fusion=teacher_fusion(cfg),
            batch_size=encode_batch_size(cfg),
            session=run.encodings,
        )
        logger.info(
            "distillation: %d training rows from the hybrid teacher (%s) in %.1f s",
            len(rows),
            "; ".join(f"{i['queries']} -> {i['corpus']}{' (cached)' if i['cached'] else ''}" for i in rows.sources),
            time.perf_counter() - t0,
        )
        if steps < planned:
            logger.info(
                "distillation: %d steps, not the %d planned: at most %g passes over the %d target queries "
                "(distill_max_passes)",
                steps,
                planned,
                cfg.distill_max_passes,
                self.num_queries,
            )
        trainer = self.build_trainer(run, steps, rows=rows)
        marker = self.run_trainer(run, trainer)
        ended = {k: v for k, v in marker.items() if k == "stopped_by_deadline_at_step"}
        # the cap ended the stage: it had fewer steps than planned, and no deadline stopped it before them
        capped = {"capped_at_passes": cfg.distill_max_passes} if steps < planned and not ended else {}
        if trainer.state.global_step > steps:
            logger.warning(
                "distillation: resumed from a checkpoint at step %d, past the %d steps this run trains (it was "
                "started with other settings)",
                trainer.state.global_step,
                steps,
            )
        checked = {"teacher_check": check} if check is not None else {}
        return {**marker, "rows": len(rows), "teacher": rows.sources, **capped, **checked}

    def teacher_check(self, run: RecipeRun) -> dict[str, Any]:
        """Whether the hybrid teacher leads the starting model, without labels
        (:func:`~hf_cocodr.retrieval.teacher.teacher_lead`: its fused ranking against the dense one on the fit's
        inverse-cloze pseudo-queries of each corpus the queries are routed to, pooled): the reading, ``leads``, and
        why in one line. The distillation runs where it leads (beyond one standard error); with ``guard: on`` the
        recipe otherwise keeps the starting model."""
        from ...retrieval.teacher import teacher_lead

        t0 = time.perf_counter()
        with preserved_rng_state():  # (what it encodes and fits leaves the training's random states as they were)
            lead = teacher_lead(
                run.model,
                run.fps["model"],
                run.target_corpora,
                distill_sources(run),
                fusion=teacher_fusion(run.cfg),
                batch_size=encode_batch_size(run.cfg),
                session=run.encodings,
            )
        said = (
            f"{lead.get('difference', 0.0):+.4f} ± {lead.get('se')} nDCG@10 over {lead['queries']} pseudo-queries, "
            f"{lead['verdict']}"
        )
        lead.update(
            method="the hybrid teacher against the starting model alone, on the fit's inverse-cloze pseudo-queries",
            why=f"the teacher {'leads' if lead['leads'] else 'does not lead'} the starting model ({said})",
            seconds=round(time.perf_counter() - t0, 1),
        )
        (logger.info if lead["leads"] else logger.warning)("distillation: teacher check: %s", lead["why"])
        return lead

    def check(self, cfg: RecipeConfig, stages) -> None:
        """Refuse, before any work, a query-side distillation (``distill_side: query``) that a stage before it would
        start from another model (its frozen documents are the starting model's vectors)."""
        if cfg.distill_side == "query" and self.enabled(cfg):
            before = trained_before(cfg, stages)
            _check_query_side(cfg, f"{', '.join(before)} would train the model before it" if before else None)

    # ------------------------------------------------------------------------------------------------ helpers
    @staticmethod
    def query_side(run: RecipeRun) -> bool:
        """Whether the query side alone trains (``distill_side: query``); refused where the frozen document side
        would not be the model the stage starts from."""
        if run.cfg.distill_side != "query":
            return False
        other = str(run.current) != str(run.model)
        _check_query_side(
            run.cfg, f"the distillation starts from {run.current}, not the starting model" if other else None
        )
        return True

    def _targets(self, run: RecipeRun) -> list[tuple[list[str], list[str], list[str]]]:
        """``(doc_ids, texts, queries)`` of each target corpus the queries are routed to, read once per run (the
        probe's rows and its timing of the teacher both use them)."""
        from ...data.teacher import route_queries
        from ...retrieval.hybrid import _corpus_ids_texts

        if self.targets is None:
            self.targets = [
                (*_corpus_ids_texts(corpus), list(src.texts))
                for corpus, src in route_queries(distill_sources(run), run.target_corpora)
            ]
        return self.targets

    def _probe_rows(self, run: RecipeRun, steps: int, model) -> TeacherRows:
        """Rows of the training rows' shape for ``steps`` steps of ``model``: target queries, target documents drawn
        at random as their candidates, random teacher scores, and for the query side random frozen vectors of the
        model's width (a probe times the step, not what it learns)."""
        import numpy as np

        from ...data.teacher import TeacherRows, teacher_rows

        docs: dict[str, str] = {}
        queries: list[str] = []
        for ids, texts, asked in self._targets(run):
            docs.update(zip(ids, texts))
            queries += asked
        gen, k = np.random.default_rng(0), int(run.cfg.distill_k)
        n = steps * int(run.arguments[self.name]["per_device_train_batch_size"])
        asked = [queries[i] for i in gen.choice(len(queries), n, replace=len(queries) < n)]
        doc_ids = list(docs)

        class _Random:
            def search(self, chunk, kk):
                picks = [[doc_ids[i] for i in gen.choice(len(doc_ids), kk, replace=len(doc_ids) < kk)] for _ in chunk]
                return picks, gen.standard_normal((len(chunk), kk)).tolist()

        if self.query_side(run):  # the candidates are rows of frozen vectors (random ones: their values cost nothing)
            import torch

            from ...data.teacher import frozen_candidate_rows

            dim = model.get_embedding_dimension()
            vectors = torch.randn(len(doc_ids), dim, generator=torch.Generator().manual_seed(0))
            doc_rows = {d: i for i, d in enumerate(doc_ids)}
            return TeacherRows(frozen_candidate_rows(_Random(), asked, doc_rows, k, vectors=vectors))
        return TeacherRows(teacher_rows(_Random(), asked, docs, k))

    def _queries_digest(self, run: RecipeRun) -> str:
        """A digest of the target queries' texts (read once per run)."""
        self._read_queries(run)
        return self.queries_digest

    def _read_queries(self, run: RecipeRun) -> None:
        from ...data.target_queries import read_target_queries

        if self.queries_digest is None:
            h, n = hashlib.sha256(), 0
            for spec in distill_sources(run):
                for text in read_target_queries(spec[0] if isinstance(spec, tuple) else spec).texts:
                    h.update(text.encode("utf-8", "surrogatepass") + b"\x1e")
                    n += 1
            self.queries_digest, self.num_queries = h.hexdigest()[:16], n

    def steps(self, run: RecipeRun) -> int:
        """The steps the stage trains: the plan's, but at most ``distill_max_passes`` passes over the target queries
        (:func:`pass_cap`) unless ``distill_steps`` fixes them."""
        planned, cap = run.plan.steps_of(self.name), self._cap(run)
        return planned if cap is None else min(planned, cap)

    def _cap(self, run: RecipeRun) -> int | None:
        if run.cfg.distill_steps is not None or run.cfg.distill_max_passes is None:  # fixed steps are yours
            return None
        if run.cfg.distill_max_passes == AUTO:
            raise ConfigError("recipe option distill_max_passes is still auto: resolve the schedule first")
        if self.per_step is None:  # queries a step: on every rank, every accumulated batch
            from ...finetuning import DistillationTrainingArguments

            args = DistillationTrainingArguments.from_arguments(run.arguments[self.name], max_steps=1)
            self.per_step = args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps
        self._read_queries(run)
        return pass_cap(self.num_queries, self.per_step, run.cfg.distill_max_passes)
