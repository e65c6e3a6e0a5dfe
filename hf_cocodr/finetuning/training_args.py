"""IDROTrainingArguments: the arguments specific to iDRO fine-tuning, plus the settings of every built-in method."""

from __future__ import annotations

from dataclasses import dataclass, field

from sentence_transformers import SentenceTransformerTrainingArguments

from ..errors import ConfigError
from ..methods.base import check_number
from ..methods.registry import builtin_settings
from ..modeling.precision import check_encode_precision
from .losses.idro import PRESETS

_check_number = check_number  # the pretraining arguments import it from here

# the methods' settings dataclasses (MoDIRSettings, ...): their fields are fields of IDROTrainingArguments
METHOD_SETTINGS: tuple[type, ...] = tuple(builtin_settings())


def check_max_steps(args) -> None:
    """``max_steps`` 0 (or below -1) would train one step or an epoch silently: refuse it; -1 means epochs."""
    if (
        isinstance(args.max_steps, bool)
        or not isinstance(args.max_steps, int)
        or (args.max_steps < 1 and args.max_steps != -1)
    ):
        raise ConfigError(
            f"max_steps must be >= 1, or -1 (the default) to train num_train_epochs; got {args.max_steps!r}"
        )
    if args.max_steps == -1:
        check_number(args, "num_train_epochs", positive=True)


@dataclass
class _IDROFields(SentenceTransformerTrainingArguments):
    """The iDRO fields of :class:`IDROTrainingArguments` (documented there); a base class so that the methods'
    settings come after them in the field order (and in ``--help``)."""

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
    idro_preset: str = field(default="paper", metadata={"help": f"iDRO preset: one of {PRESETS}"})
    num_clusters: int = field(default=50, metadata={"help": "K, number of query clusters"})
    idro_beta: float = field(default=0.25, metadata={"help": "beta of the loss-scaling terms"})
    idro_tau: float = field(default=1.0, metadata={"help": "tau (temperature) of the weight update"})
    idro_gram_normalization: str = field(
        default="none",
        metadata={
            "help": "paper preset: none (raw gradient inner products, as the paper writes the rule) or diag (the Gram "
            "divided by its mean diagonal each step, so tau does not depend on the encoder's gradient scale)"
        },
    )
    idro_grad_params: str = field(default="auto", metadata={"help": "gradient-similarity parameter subset"})
    idro_scale: float = field(default=1.0, metadata={"help": "similarity scale of the InfoNCE"})
    in_batch_negatives: bool = field(default=True, metadata={"help": "use in-batch negatives"})
    cluster_every_steps: int = field(default=0, metadata={"help": "re-cluster every N steps (0: each epoch)"})
    kmeans_max_points_per_centroid: int | None = field(
        default=None, metadata={"help": "K-Means training points per centroid (None: all points)"}
    )
    kmeans_niter: int = field(default=20, metadata={"help": "K-Means iterations"})
    kmeans_backend: str = field(default="auto", metadata={"help": "auto | faiss | torch"})
    cluster_weight_carry: str = field(default="match", metadata={"help": "match | reset"})
    num_negatives: int = field(default=1, metadata={"help": "hard negatives per query"})
    refresh_negatives_every_steps: int = field(default=0, metadata={"help": "refresh self negatives every N steps"})
    negatives_top_k: int = field(default=100, metadata={"help": "negatives sampled from the top-k"})
    negatives_skip_top: int = field(default=0, metadata={"help": "skip the first ranks when sampling negatives"})
    negatives_encode_precision: str = field(
        default="fp32",
        metadata={
            "help": "precision of the corpus encoding for self-mined negatives: fp32 | bf16 | int8 (dynamic, CPU)"
        },
    )
    recluster_on_refresh: bool = field(default=True, metadata={"help": "re-cluster at each negatives refresh"})
    encode_batch_size: int = field(default=64, metadata={"help": "batch size of the callbacks' encoding passes"})
    max_length: int | None = field(
        default=None,
        metadata={
            "help": "token limit of training texts (and of the negative-refresh encoding); the saved model "
            "keeps its own limits for inference"
        },
    )
    packed_forward: bool = field(
        default=True,
        metadata={
            "help": "embed every text of a step in one forward per length group (False: one forward per column)"
        },
    )


@dataclass
class IDROTrainingArguments(*reversed(METHOD_SETTINGS), _IDROFields):
    r"""Arguments of :class:`~hf_cocodr.IDROTrainer`; only the parameters specific to iDRO are listed here.

    See :class:`~sentence_transformers.SentenceTransformerTrainingArguments` for the rest
    (``per_device_train_batch_size`` is the number of *queries* per device and step).

    Loss (used when the trainer builds the :class:`~hf_cocodr.IDROLoss` itself):
        idro_preset: ``"paper"``, ``"reference"``, ``"groupdro"`` or ``"uniform"``.
        num_clusters: K, the number of K-Means query clusters.
        idro_beta / idro_tau: β and τ of the weight update.
        idro_gram_normalization: ``"none"`` (the paper's rule as written) or ``"diag"`` (the Gram over its mean
            diagonal, so τ does not depend on the encoder's gradient scale; see :class:`~hf_cocodr.IDROLoss`).
        idro_grad_params: the gradient-similarity parameter subset (``"auto"``, ``"last_layer"``,
            ``"last_norm"``, ``"last_blocks:N"``).
        idro_scale: similarity scale (1/temperature) of the InfoNCE.
        in_batch_negatives: other documents of the batch are negatives too.
    Clustering:
        cluster_every_steps: re-cluster every N optimizer steps (0: only at the start of each epoch).
        kmeans_max_points_per_centroid: training-point cap per centroid (None: all points; faiss's own default
            would sample 256·K points).
        kmeans_niter: Lloyd iterations.
        kmeans_backend: ``"auto"`` (faiss when installed), ``"faiss"`` or ``"torch"``.
        cluster_weight_carry: ``"match"`` (carry ω over by matching new centroids to old ones) or ``"reset"``.
    Negatives:
        num_negatives: hard negatives per query in each row.
        refresh_negatives_every_steps: re-mine self negatives (ANCE-style) every N steps (0: never).
        negatives_top_k / negatives_skip_top: sample negatives from ranks ``[skip_top, top_k)`` of the model's own
            ranking (labelled positives removed).
        recluster_on_refresh: re-cluster whenever negatives are refreshed (as the paper does).
        max_length: token limit of the training texts (None: the model's own); the saved model keeps its limits.
        packed_forward: embed the queries and every document column of a step together, ordered by length, in one
            forward per length group (:mod:`hf_cocodr.modeling.packing`); False: one forward per column.
    Seed methods (used when ``--method`` / :func:`~hf_cocodr.methods.configure_methods` turns them on): the
        fields of each registered method's settings dataclass (``METHOD_SETTINGS``), e.g. ``modir_lambda``
        (:class:`~hf_cocodr.methods.MoDIRSettings`), ``berm_alpha`` (:class:`~hf_cocodr.methods.BERMSettings`),
        ``rmsc_k`` (:class:`~hf_cocodr.methods.RMSCSettings`); each class documents its own.
    """

    def __post_init__(self):
        super().__post_init__()
        if self.idro_preset not in PRESETS:
            raise ConfigError(f"idro_preset must be one of {PRESETS}, got {self.idro_preset!r}")
        if self.idro_gram_normalization not in ("none", "diag"):
            raise ConfigError(f"idro_gram_normalization must be none or diag, got {self.idro_gram_normalization!r}")
        if self.num_clusters < 1:
            raise ConfigError(f"num_clusters must be >= 1, got {self.num_clusters}")
        check_max_steps(self)
        check_encode_precision(self.negatives_encode_precision, "negatives_encode_precision")
        for name in ("idro_tau", "idro_scale"):
            check_number(self, name, positive=True)
        for name in ("idro_beta", "learning_rate", "weight_decay", "warmup_steps"):
            check_number(self, name, positive=False)
        if self.cluster_weight_carry not in ("match", "reset"):
            raise ConfigError(f"cluster_weight_carry must be 'match' or 'reset', got {self.cluster_weight_carry!r}")
        if self.kmeans_backend not in ("auto", "faiss", "torch"):
            raise ConfigError(f"kmeans_backend must be auto, faiss or torch, got {self.kmeans_backend!r}")
        for name in ("cluster_every_steps", "num_negatives", "refresh_negatives_every_steps", "negatives_skip_top"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.negatives_top_k <= self.negatives_skip_top:
            raise ConfigError(
                f"negatives_top_k ({self.negatives_top_k}) must be larger than negatives_skip_top "
                f"({self.negatives_skip_top})"
            )
        for settings in METHOD_SETTINGS:  # each method checks its own settings, by name
            settings.check(self)
