"""HybridDistillLoss: listwise distillation of a teacher's ranking into the student, with in-batch negatives.

Each training row is ``(query, candidate_1, ..., candidate_k)`` with ``label`` = the teacher's ``k`` scores (for
the recipe: the fused scores of the starting model + BM25 hybrid, best first). The loss is

    KL( softmax(t / T_t) ‖ softmax(s / T_s) )  +  λ · InfoNCE(query, candidate_1; in-batch candidates)

with ``s`` the student's similarity of the query to each candidate (the model's own similarity: dot product or
cosine). The KL term is sentence-transformers' ``DistillKLDivLoss`` without its ``T_s²`` factor: that factor keeps
gradients comparable for temperatures of 1 and above, but a cosine student at ``T_s = 0.05`` (its trained scale of
20) would have its KL gradient shrunk 400-fold against the in-batch term, which would then train alone. Unscaled, the
KL's gradient on the student's similarities is ``(p_student − p_teacher) / T_s``, the same scale as the in-batch
term's. The in-batch term is its ``MultipleNegativesRankingLoss`` on the teacher's first candidate, so the student
keeps the in-batch contrast it was trained with. With ``in_batch_weight=0`` and a teacher whose scores are the
student's own (same temperatures), the loss is at its minimum, 0, and so is its gradient.

``document_gradients=False`` encodes the candidates without a graph (a forward pass only, about a third of the cost
of a forward and backward pass): the loss and its value are the same, but only the queries' side of the loss moves
the weights (the documents are encoded by the same weights, so their embeddings follow the model all the same).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from ...data.teacher import FrozenCandidateRows, TeacherRows
from ...modeling.packing import embed_packed

__all__ = ["HybridDistillLoss", "QuerySideDistillLoss", "distill_loss"]


class HybridDistillLoss(nn.Module):
    """Listwise KL to the teacher's scores over each query's candidates, plus ``in_batch_weight`` × InfoNCE.

    Args:
        model: the student ``SentenceTransformer``.
        temperature: the student's temperature ``T_s``; None (the default): 0.05 for a cosine model (the scale 20
            it was trained with), 1 for a dot-product model.
        teacher_temperature: ``T_t``, matched to the spread of the teacher's scores (z-normalised fused scores: 1).
        in_batch_weight: ``λ``; 0 turns the in-batch term off.
        similarity: ``"cosine"`` or ``"dot"``; default: the model's own ``similarity_fn_name``.
        document_gradients: back-propagate through the candidates' embeddings (default); ``False`` encodes them
            without a graph, so a step costs about the queries' forward and backward pass plus the candidates'
            forward pass.
    """

    side = "full"  # what a step trains: the whole model (QuerySideDistillLoss: the query side)

    def __init__(
        self,
        model,
        temperature: float | None = None,
        teacher_temperature: float = 1.0,
        in_batch_weight: float = 1.0,
        similarity: str | None = None,
        document_gradients: bool = True,
    ):
        super().__init__()
        from sentence_transformers import util
        from sentence_transformers.sentence_transformer.losses import DistillKLDivLoss, MultipleNegativesRankingLoss

        similarity = similarity or getattr(model, "similarity_fn_name", None) or "cosine"
        if temperature is None:
            temperature = 0.05 if similarity == "cosine" else 1.0
        for name, value in (("temperature", temperature), ("teacher_temperature", teacher_temperature)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"HybridDistillLoss {name} must be a positive number, got {value!r}")
        if isinstance(in_batch_weight, bool) or not isinstance(in_batch_weight, int | float) or in_batch_weight < 0:
            raise ValueError(f"HybridDistillLoss in_batch_weight must be a number >= 0, got {in_batch_weight!r}")
        if similarity not in ("cosine", "dot"):
            raise ValueError(f"HybridDistillLoss similarity must be 'cosine' or 'dot', got {similarity!r}")
        if not isinstance(document_gradients, bool):
            raise ValueError(f"HybridDistillLoss document_gradients must be true or false, got {document_gradients!r}")
        self.model = model
        self.similarity = similarity
        self.document_gradients = document_gradients
        self.temperature = float(temperature)
        self.teacher_temperature = float(teacher_temperature)
        self.in_batch_weight = float(in_batch_weight)
        pairwise = util.pairwise_cos_sim if similarity == "cosine" else util.pairwise_dot_score
        matrix = util.cos_sim if similarity == "cosine" else util.dot_score
        self.kl = DistillKLDivLoss(
            model,
            similarity_fct=pairwise,
            student_temperature=self.temperature,
            teacher_temperature=self.teacher_temperature,
        )
        self.in_batch = MultipleNegativesRankingLoss(model, scale=1.0 / self.temperature, similarity_fct=matrix)

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor) -> Tensor:
        return self.compute_loss_from_embeddings(self.embed(sentence_features), labels)

    def embed(self, sentence_features: Iterable[dict[str, Tensor]]) -> list[Tensor]:
        """``[queries, candidates_1, ..., candidates_k]`` embeddings. Features that carry a packing plan
        (:class:`~hf_cocodr.modeling.packing.PackedColumns`, what the trainer hands over) go through one forward
        per length group; others through one forward for the queries and one for every candidate column merged.
        With ``document_gradients=False`` the candidates are embedded without a graph."""
        from sentence_transformers.base.losses.merged_forward import embed_columns

        packed = getattr(sentence_features, "packed", None)
        features = list(sentence_features)
        grad = torch.is_grad_enabled()
        if self.document_gradients or not grad:
            if packed is not None:
                return embed_packed(self.model, features, packed=packed)
            return embed_columns(self.model, features)
        queries = self.model(features[0])["sentence_embedding"]
        with torch.no_grad():
            return [queries, *embed_columns(self.model, features[1:], separate_first=False)]

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor) -> Tensor:
        """The loss of ``[queries, candidates_1, ..., candidates_k]`` embeddings and the teacher's ``(B, k)`` scores."""
        # DistillKLDivLoss multiplies the KL by T_s²; undone (see the module docstring)
        loss = self.kl.compute_loss_from_embeddings(embeddings, labels.to(embeddings[0].dtype)) / self.temperature**2
        if self.in_batch_weight:
            loss = loss + self.in_batch_weight * self.in_batch.compute_loss_from_embeddings(embeddings[:2], None)
        return loss

    @property
    def citation(self) -> str:
        return self.kl.citation

    def get_config_dict(self) -> dict:
        return {
            "temperature": self.temperature,
            "teacher_temperature": self.teacher_temperature,
            "in_batch_weight": self.in_batch_weight,
            "similarity": self.similarity,
            "document_gradients": self.document_gradients,
        }


class QuerySideDistillLoss(HybridDistillLoss):
    """:class:`HybridDistillLoss` against a frozen document index: only the queries are encoded (and trained); each
    candidate's embedding is a row of ``document_embeddings``, the starting model's vectors of the corpus (the
    teacher's dense index). A step then costs the queries' forward and backward pass alone.

    The labels of a step are ``(B, 2, k)``: ``labels[:, 0]`` the teacher's scores, ``labels[:, 1]`` the candidates'
    rows in ``document_embeddings`` (whole numbers, exact in float64 up to 2^53), as
    :class:`~hf_cocodr.data.teacher.FrozenCandidateRows` gives them. With the same rows, the loss is
    :class:`HybridDistillLoss`'s with the candidates encoded by the frozen starting model.

    Args:
        model: the student (its query route trains; its documents are never encoded here).
        document_embeddings: ``(N, d)`` vectors of the documents the candidates' rows index (normalised for a
            cosine model, as the index holds them).
        **kwargs: as :class:`HybridDistillLoss` (``document_gradients`` has no meaning here and is refused).
    """

    side = "query"

    def __init__(self, model, document_embeddings, **kwargs):
        if "document_gradients" in kwargs:
            raise ValueError(
                "QuerySideDistillLoss: the documents are frozen vectors; document_gradients has no meaning"
            )
        super().__init__(model, **kwargs)
        table = torch.as_tensor(document_embeddings, dtype=torch.float32)
        if table.ndim != 2 or not len(table):
            raise ValueError(f"QuerySideDistillLoss: document_embeddings must be (N, d), got {tuple(table.shape)}")
        self.document_embeddings = table  # a plain tensor: never a parameter, never saved with the model

    def candidate_embeddings(self, rows: Tensor, device) -> list[Tensor]:
        """The candidates' embeddings of a step: ``rows`` ``(B, k)`` of the frozen table, one ``(B, d)`` per column."""
        if self.document_embeddings.device != torch.device(device):
            self.document_embeddings = self.document_embeddings.to(device)
        picked = self.document_embeddings[rows.to(device)]
        return [picked[:, j] for j in range(picked.shape[1])]

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor) -> Tensor:
        features = list(sentence_features)
        if labels is None or labels.ndim != 3 or labels.shape[1] != 2:
            raise ValueError(
                "QuerySideDistillLoss needs labels of shape (batch, 2, k): the teacher's scores and the candidates' "
                "rows (FrozenCandidateRows)"
            )
        queries = self.model(features[0])["sentence_embedding"]
        rows = labels[:, 1].round().long()
        return self.compute_loss_from_embeddings(
            [queries, *self.candidate_embeddings(rows, queries.device)], labels[:, 0]
        )

    def get_config_dict(self) -> dict:
        config = {k: v for k, v in super().get_config_dict().items() if k != "document_gradients"}
        return {**config, "documents": f"frozen ({len(self.document_embeddings)} vectors)"}


def distill_loss(model, rows, **settings) -> HybridDistillLoss:
    """The distillation loss ``rows`` train with its ``settings`` (those of :class:`HybridDistillLoss`):
    :class:`QuerySideDistillLoss` against the frozen vectors of :class:`~hf_cocodr.data.teacher.FrozenCandidateRows`
    (``document_gradients`` has no meaning there and is left out), :class:`HybridDistillLoss` for rows of texts."""
    rows = rows.rows if isinstance(rows, TeacherRows) else rows
    if isinstance(rows, FrozenCandidateRows):
        if rows.vectors is None:
            raise ValueError(
                "distill_loss: FrozenCandidateRows without their vectors (vectors=...): give the rows the frozen "
                "vectors their candidates index, or build a QuerySideDistillLoss with them"
            )
        settings = {k: v for k, v in settings.items() if k != "document_gradients"}
        return QuerySideDistillLoss(model, rows.vectors, **settings)
    return HybridDistillLoss(model, **settings)
