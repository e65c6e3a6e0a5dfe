"""The model side of MTEB: a loaded SentenceTransformer as an mteb encoder, and the loader of a raw checkpoint."""

from __future__ import annotations

from typing import Any

from ...utils import import_mteb
from .common import warnings_quiet


def mteb_model(model, meta):
    """An MTEB encoder for a loaded SentenceTransformer, carrying ``meta`` (so ``mteb.evaluate`` runs it offline).

    ``mteb.evaluate`` uses the ``mteb_model_meta`` of the object it gets for the results path and ``model_meta.json``
    and never loads the model by name; the wrapper encodes queries with ``encode_query`` and documents with
    ``encode_document`` and scores with the model's own similarity.
    """
    import_mteb()  # (the random states kept: hf_cocodr.utils.import_mteb)
    from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper  # heavy: on first use

    with warnings_quiet():
        wrapped = SentenceTransformerEncoderWrapper(model)
    # The wrapper has no argument for a ModelMeta (mteb 2.26.24: __init__ always sets its own, from
    # ModelMeta.from_sentence_transformer_model, which has no name for a local model): ours replaces it.
    wrapped.mteb_model_meta = meta
    return wrapped


def _sentence_transformers_loader():
    """mteb's loader for a sentence-transformers model (the ``loader`` of its ``ModelMeta``)."""
    import_mteb()  # (the random states kept: hf_cocodr.utils.import_mteb)
    from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper  # heavy: on first use

    return SentenceTransformerEncoderWrapper


# Self-contained (only sentence-transformers and mteb): mteb_meta_snippet copies this function into the PR snippet.
def cocodr_sentence_transformer_loader(
    model_name: str,
    revision: str | None = None,
    device: str | None = None,
    pooling_mode: str = "cls",
    similarity_fn_name: str = "dot",
    max_seq_length: int | None = None,
    **kwargs: Any,
):
    """Load a raw transformers checkpoint (no ``modules.json``) as an MTEB encoder with COCO-DR's pooling/similarity.

    CLS pooling and dot-product similarity by default, instead of sentence-transformers' mean-pooling fallback.
    """
    import_mteb()  # (the random states kept; the snippet's copy of this function leaves this line out)
    from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    hub = {"revision": revision} if revision else {}
    transformer = Transformer(
        model_name,
        max_seq_length=max_seq_length,
        model_kwargs=dict(hub),
        processor_kwargs=dict(hub),
        config_kwargs=dict(hub),
    )
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling_mode)
    model = SentenceTransformer(modules=[transformer, pooling], similarity_fn_name=similarity_fn_name, device=device)
    return SentenceTransformerEncoderWrapper(model, revision=revision, **kwargs)
