"""The fusion an adapted model's hybrid keeps (:func:`kept_fusion`).

Where the recipe trained the query side alone (the corpus-only and unlabelled-query paths on a CPU), the adapted
model's documents go through the starting model's route: its hybrid has the start's document vectors and the same
BM25 index, and differs from the start's hybrid only in how queries are encoded. It keeps the start's fusion (fitted to
the corpus without labels, calibrated to the target queries given from the corpus's folder), the fusion its teacher
used, so the adapted hybrid is the start's hybrid with the trained query encoder, and the guard's and the evaluation's
readings of it compare that change alone. The fit is not run again for the adapted model: its choice among nearly
equal grid points moves within its own noise from one model to the next (docs/adaptation.md, "The hybrid of an adapted
model"), and its pseudo-queries are of the kind the training read. A model whose document side trained gets its own
fit, as every other model does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .queries import hybrid_queries
from .settings import encode_batch_size

if TYPE_CHECKING:
    from ..retrieval.fusion import FusionConfig
    from ..retrieval.session import EncodingSession
    from .context import RecipeRun


def shares_documents(model, start) -> bool:
    """Whether ``model`` encodes documents as ``start`` does (a query-side model of it, or the start itself)."""
    from ..retrieval.encoding_cache import document_encoder_key  # (torch)

    return document_encoder_key(model) == document_encoder_key(start)


def start_fusion(run: RecipeRun, start, corpus, session: EncodingSession | None) -> FusionConfig:
    """The fusion of the starting model's hybrid over ``corpus`` as the recipe saves it (fitted once per ``session``:
    the teacher's fit, reused)."""
    from ..retrieval.hybrid import HybridRetriever  # (the retrieval stack: torch, faiss, bm25s)

    hybrid = HybridRetriever.build(
        start,
        corpus,
        queries=hybrid_queries(corpus, run.cfg.target_queries),
        batch_size=encode_batch_size(run.cfg),
        session=session,
    )
    return hybrid.fusion


def kept_fusion(
    run: RecipeRun, model, start, corpus, session: EncodingSession | None, *, shared: bool | None = None
) -> FusionConfig | None:
    """The fusion ``model``'s hybrid over ``corpus`` keeps: the start's (:func:`start_fusion`) where ``model`` shares
    its document route with ``start`` (``start``: the loaded starting model; ``shared``: that answer where the caller
    has it, :func:`shares_documents`); None (fitted for ``model`` itself) otherwise."""
    if shared is None:
        shared = shares_documents(model, start)
    return start_fusion(run, start, corpus, session) if shared else None


def kept_eval_fusion(
    model, start, start_result: dict[str, Any] | None, *, shared: bool | None = None
) -> dict[str, Any] | None:
    """The fusion the evaluation of ``model``'s hybrid on one split keeps: the one the starting model's evaluation
    of that split fitted (``start_result``: its result as the recipe records it, ``hybrid.fusion``), where ``model``
    shares its document route with ``start`` (``shared``: that answer where the caller has it); None (fitted for
    ``model``) otherwise or where the start was not evaluated."""
    fusion = ((start_result or {}).get("hybrid") or {}).get("fusion")
    if not fusion:
        return None
    if shared is None:
        shared = shares_documents(model, start)
    return dict(fusion) if shared else None
