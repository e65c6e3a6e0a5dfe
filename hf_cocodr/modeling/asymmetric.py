"""Asymmetric models: a query encoder that trains beside a frozen document encoder, as one sentence-transformers
model (its ``Router`` module: ``encode_query`` takes the ``query`` route, ``encode_document`` and ``encode`` the
``document`` route).

Query-side distillation (the recipe's ``distill_side: query``) trains :func:`query_side_model` of the starting
model: the query route is a copy of the starting model that learns, the document route is the starting model itself,
frozen. The saved model loads with ``SentenceTransformer(path)``, and its document vectors are the starting model's,
bit for bit, so an index a user built with the starting model stays valid: only the queries are encoded anew.
"""

from __future__ import annotations

import copy

__all__ = ["document_modules", "is_asymmetric", "query_modules", "query_side_model"]


def is_asymmetric(model) -> bool:
    """Whether ``model`` routes queries and documents through different modules (a ``Router`` first)."""
    from sentence_transformers.base.modules import Router

    modules = list(model)
    return bool(modules) and isinstance(modules[0], Router)


def document_modules(model) -> list:
    """The modules a document goes through: the document route of an asymmetric model, all of a plain one."""
    if not is_asymmetric(model):
        return list(model)
    router = list(model)[0]
    return list(router.sub_modules[router._resolve_route(task="document")]) + list(model)[1:]


def query_modules(model) -> list:
    """The modules a query goes through: the query route of an asymmetric model, all of a plain one."""
    if not is_asymmetric(model):
        return list(model)
    router = list(model)[0]
    return list(router.sub_modules[router._resolve_route(task="query")]) + list(model)[1:]


def query_side_model(model):
    """An asymmetric copy of ``model`` (a plain SentenceTransformer): the ``query`` route a trainable copy of its
    modules, the ``document`` route a frozen copy (``requires_grad`` off, so no optimizer moves it); the default
    route is the document one (``encode`` embeds documents). Its similarity, prompts and token limit are the model's."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Router

    if is_asymmetric(model):
        raise ValueError("query_side_model: the model is asymmetric already")
    query = [copy.deepcopy(m) for m in model]
    document = [copy.deepcopy(m) for m in model]
    for module in document:
        module.requires_grad_(False)
    router = Router.for_query_document(query_modules=query, document_modules=document, default_route="document")
    out = SentenceTransformer(
        modules=[router],
        device=str(model.device),
        similarity_fn_name=model.similarity_fn_name,
        prompts=dict(getattr(model, "prompts", None) or {}),
        default_prompt_name=getattr(model, "default_prompt_name", None),
    )
    return out
