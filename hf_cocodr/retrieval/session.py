"""The state a run's corpus encodings share (:class:`EncodingSession`): passed as ``session=`` to each function that
encodes a corpus or fits a fusion, never set around it.

A session says in which precision corpora are encoded, whether their vectors come from (and go to) the disk cache
of :mod:`~hf_cocodr.retrieval.encoding_cache` (with the record of each encoding), and holds what the run computed
once: the fusion fits, the corpora's fingerprints and, where asked, the indexes it built. The recipe makes one per
run (:func:`~hf_cocodr.recipe.run_recipe`); a call without one gets ``EncodingSession()``: fp32, no cache, nothing
kept from one call to the next.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConfigError

__all__ = ["REUSE_MAX_BYTES", "EncodingSession"]

REUSE_MAX_BYTES = 1 << 30  # what the indexes a session keeps in memory may hold in all
SESSION_PRECISIONS = ("fp32", "bf16")  # a run's corpus encodings (resolve_corpus_precision resolves "auto")


@dataclass(eq=False)
class EncodingSession:
    """How one run encodes corpora, and what it has encoded or fitted so far.

    Args:
        precision: the corpus encodings' precision: ``fp32``, or ``bf16`` (autocast on the model's device unless the
            caller set autocast itself; :func:`~hf_cocodr.retrieval.encoding.encode_texts`). The disk cache, the
            kept indexes and the teacher's cache are keyed by it.
        cache: :func:`~hf_cocodr.retrieval.encoding.build_index` serves a corpus's vectors from the disk cache when
            the same document encoder, corpus, length and precision encoded it before, and stores what it encodes;
            each encoding or reuse is appended to ``record``; the fusion fits and the corpora's fingerprints are
            computed once in the session (:meth:`remembered`).
        record: the list each encoding or reuse is appended to (with ``cache``).
        reuse: :func:`~hf_cocodr.retrieval.encoding.build_index` keeps the indexes it builds in memory (up to
            :data:`REUSE_MAX_BYTES` of vectors in all), so the same weights (their SHA-256), corpus dataset and
            settings are encoded once (:meth:`with_reuse`).
    """

    precision: str = "fp32"
    cache: bool = False
    record: list[dict[str, Any]] = field(default_factory=list, repr=False)
    reuse: bool = False
    # what the session computed once: (kind, key) -> value (fits, the fits' documents), a corpus's fingerprint by
    # its dataset, and the indexes kept with ``reuse`` (key -> (index, order))
    memo: dict[tuple, Any] = field(default_factory=dict, repr=False)
    corpus_keys: dict[tuple, str] = field(default_factory=dict, repr=False)
    indexes: dict[tuple, tuple] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.precision not in SESSION_PRECISIONS:
            raise ConfigError(f"a run's corpus encodings are fp32 or bf16, got {self.precision!r}")

    def with_reuse(self) -> EncodingSession:
        """A session sharing this one's precision, cache, record and memos that also keeps the indexes it builds in
        memory (none kept yet): the recipe evaluates its final model and then builds that model's hybrid retrievers
        over the target corpora, which are often the evaluation corpora too."""
        return replace(self, reuse=True, indexes={})

    def remembered(self, kind: str, key: tuple, compute: Callable[[], Any]) -> Any:
        """With :attr:`cache`, the value ``compute()`` gave for the same ``(kind, key)`` earlier in the session
        (computed once; kept in memory only); without, ``compute()``."""
        if not self.cache:
            return compute()
        if (kind, key) not in self.memo:
            self.memo[(kind, key)] = compute()
        return self.memo[(kind, key)]

    def kept(self, key: tuple | None) -> tuple | None:
        """The ``(index, order)`` kept under ``key`` (:attr:`reuse`), or None."""
        return self.indexes.get(key) if self.reuse and key is not None else None

    def keep(self, key: tuple | None, index, order, dim: int) -> None:
        """Keep an index under ``key`` (:attr:`reuse`) while the kept ones stay under :data:`REUSE_MAX_BYTES`."""
        if not self.reuse or key is None:
            return
        if 4 * dim * (len(order) + sum(len(o) for _, o in self.indexes.values())) <= REUSE_MAX_BYTES:
            self.indexes[key] = (index, order)

    def note(self, entry: dict[str, Any]) -> None:
        """Append one encoding or reuse to :attr:`record` (with :attr:`cache`)."""
        if self.cache:
            self.record.append(entry)
