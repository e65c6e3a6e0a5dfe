"""CocoPretrainingArguments: the arguments specific to COCO continuous contrastive pretraining."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments

from ..errors import ConfigError
from ..finetuning.training_args import _check_number, check_max_steps


@dataclass
class CocoPretrainingArguments(TrainingArguments):
    r"""Arguments of :class:`~hf_cocodr.CocoPretrainer`; only the parameters specific to COCO are listed here.

    ``per_device_train_batch_size`` counts *documents* per device; each gives two spans, so the contrastive batch
    is documents × 2 × world size spans, every other span being a negative. Defaults follow the paper for base
    models: ``learning_rate=1e-4``, 10% warm-up, ``weight_decay=0.01``.

    Spans:
        span_mode: ``"sentence_groups"`` (COCO-DR) or ``"random_crops"`` (coCondenser).
        span_max_tokens: word-piece budget of a sentence group. span_break_prob: chance to close a span early at
            each sentence boundary. span_len: crop length for ``random_crops``. min_span_tokens: shorter spans are
            dropped. max_span_length: token limit of an encoded span (including special tokens).
        sentence_splitter: ``"regex"`` (fast, offline) or ``"pysbd"``.
    Masking:
        mlm_probability: fraction of tokens masked (whole words, 80/10/10).
    Loss:
        head_mlm_weight / mlm_weight / contrastive_weight: weights of the three terms (all 1). With both MLM
            weights 0 the spans are not masked and no MLM forward runs (contrast-only continued pretraining, as in
            Contriever): the right choice for a model without a trained MLM head.
        contrastive_similarity: ``"dot"`` (paper) or ``"cosine"``. contrastive_temperature: divides the scores.
        pooling: ``"cls"`` (paper) or ``"mean"`` for the contrastive representation and the export.
    Scale:
        gradient_cache_chunk_size: encode the contrastive batch in chunks of this many documents with a gradient
            cache (0: off); identical gradients, memory bounded by the chunk.
        backbone_dropout: keep the backbone's dropout on (False reproduces the reference code).
        mlm_head_warmup_steps: during the first N steps the MLM losses train the heads only (their gradients stop at
            the encoder), so a freshly created MLM head (e.g. all-MiniLM-L6-v2 has none) does not disturb the encoder
            with random-head gradients; the contrastive loss trains the encoder from the first step.
    Model:
        n_head_layers / skip_from: Condenser head depth and the backbone layer feeding it (default: 6 for 12-layer
            models, half the depth otherwise).
    """

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": (
                "write into an output_dir that holds files hf_cocodr did not write (they stay untouched), and replace the "
                "files of an earlier or different run recorded there (hf_cocodr_run.json); without it such a folder is "
                "refused"
            )
        },
    )
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate (1e-4 base, 1e-5 large)"})
    warmup_steps: float = field(default=0.1, metadata={"help": "warm-up steps, or a ratio when < 1"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})

    span_mode: str = field(default="sentence_groups", metadata={"help": "sentence_groups | random_crops"})
    span_max_tokens: int = field(default=30, metadata={"help": "max word pieces per sentence group"})
    span_break_prob: float = field(default=0.1, metadata={"help": "probability of closing a span early"})
    span_len: int = field(default=64, metadata={"help": "crop length for random_crops"})
    min_span_tokens: int = field(default=4, metadata={"help": "drop spans shorter than this"})
    max_span_length: int = field(default=128, metadata={"help": "token limit of an encoded span"})
    sentence_splitter: str = field(default="regex", metadata={"help": "regex | pysbd"})
    mlm_probability: float = field(default=0.15, metadata={"help": "masking rate (whole words)"})
    head_mlm_weight: float = field(default=1.0, metadata={"help": "weight of the Condenser-head MLM loss"})
    mlm_weight: float = field(default=1.0, metadata={"help": "weight of the backbone MLM loss"})
    contrastive_weight: float = field(default=1.0, metadata={"help": "weight of the span contrastive loss"})
    contrastive_similarity: str = field(default="dot", metadata={"help": "dot | cosine"})
    contrastive_temperature: float = field(default=1.0, metadata={"help": "scores are divided by this"})
    pooling: str = field(default="cls", metadata={"help": "cls | mean"})
    gradient_cache_chunk_size: int = field(default=0, metadata={"help": "documents per gradient-cache chunk (0: off)"})
    backbone_dropout: bool = field(default=True, metadata={"help": "keep backbone dropout on"})
    mlm_head_warmup_steps: int = field(
        default=0, metadata={"help": "first N steps: MLM gradients stop at the encoder (warm up a fresh MLM head)"}
    )
    n_head_layers: int = field(default=2, metadata={"help": "Condenser head layers"})
    skip_from: int | None = field(default=None, metadata={"help": "backbone layer feeding the head"})
    text_column: str = field(default="text", metadata={"help": "text column of dataset/JSONL corpora"})

    @property
    def uses_mlm(self) -> bool:
        """False when both MLM weights are 0: spans are then not masked and no MLM forward is computed."""
        return self.mlm_weight > 0 or self.head_mlm_weight > 0

    def __post_init__(self):
        super().__post_init__()
        if self.span_mode not in ("sentence_groups", "random_crops"):
            raise ConfigError(f"span_mode must be 'sentence_groups' or 'random_crops', got {self.span_mode!r}")
        if self.contrastive_similarity not in ("dot", "cosine"):
            raise ConfigError(f"contrastive_similarity must be 'dot' or 'cosine', got {self.contrastive_similarity!r}")
        if self.pooling not in ("cls", "mean"):
            raise ConfigError(f"pooling must be 'cls' or 'mean', got {self.pooling!r}")
        if not 0 < self.mlm_probability < 1:
            raise ConfigError(f"mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if not 0 <= self.span_break_prob < 1:
            raise ConfigError(f"span_break_prob must be in [0, 1), got {self.span_break_prob}")
        check_max_steps(self)
        _check_number(self, "contrastive_temperature", positive=True)
        for name in (
            "head_mlm_weight",
            "mlm_weight",
            "contrastive_weight",
            "learning_rate",
            "weight_decay",
            "warmup_steps",
        ):
            _check_number(self, name, positive=False)
        if self.gradient_cache_chunk_size < 0:
            raise ConfigError("gradient_cache_chunk_size must be >= 0")
        if self.max_span_length < self.min_span_tokens + 2:
            raise ConfigError("max_span_length must leave room for min_span_tokens plus the special tokens")
        if self.sentence_splitter not in ("regex", "pysbd"):
            raise ConfigError(f"sentence_splitter must be 'regex' or 'pysbd', got {self.sentence_splitter!r}")
        if self.n_head_layers < 1:
            raise ConfigError("n_head_layers must be >= 1")
