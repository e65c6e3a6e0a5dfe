"""Vectors on disk: a corpus's dense vectors streamed chunk by chunk into a memory-mapped ``.npy`` file, opened again
in constant time (checked against its header and the number of rows its record expects), and searched exactly in
blocks (:class:`MappedIndex`), so peak memory is one block, not the corpus.

The file is a plain ``.npy`` (``numpy.load`` reads it) in the precision of the encoding: float32 for an fp32
encoding, float16 for a bf16 or fp16 one (numpy has no bf16; fp16 keeps 11 significant bits to bf16's 8, and
:func:`as_stored` rounds the vectors to what the file holds before anything uses them, so an encoding read back is
bit for bit the one that was written). It is written under a staging name beside its destination and renamed when
complete (:class:`VectorWriter`): a reader never sees half a file, and one a killed run left is swept by the next.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..storage import staging_path, sweep_stale

logger = logging.getLogger(__name__)

__all__ = ["MappedIndex", "VectorWriter", "as_stored", "open_vectors", "storage_dtype"]

FP16_MAX = float(np.finfo(np.float16).max)
BLOCK_BYTES = 32 << 20  # the vectors one search block reads (as float32)
SCORES_BYTES = 64 << 20  # the query-by-block score matrix of one step


def storage_dtype(precision: str) -> np.dtype:
    """The dtype an encoding in ``precision`` is kept in: float16 for ``bf16`` / ``fp16`` (autocast), else
    float32."""
    return np.dtype(np.float16) if precision in ("bf16", "fp16") else np.dtype(np.float32)


def as_stored(vectors: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``vectors`` (float32) rounded to what a file of ``dtype`` holds, as float32: unchanged for float32; for
    float16, a value beyond its range (|x| > 65504) is refused with one line rather than stored as infinite."""
    if np.dtype(dtype) == np.float32:
        return vectors
    if vectors.size and float(np.abs(vectors).max()) > FP16_MAX:
        raise ConfigError(
            f"a vector value of {float(np.abs(vectors).max()):.4g} is beyond float16's range (65504), in which a "
            "bf16 encoding is kept: encode in fp32 (encode_precision fp32)"
        )
    return vectors.astype(np.float16).astype(np.float32)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class VectorWriter:
    """A ``(rows, dim)`` ``.npy`` file of ``dtype`` written in pieces (:meth:`write`, any rows in any order), staged
    beside ``path`` and renamed to it by :meth:`commit`; until then nothing exists under ``path``. A writer that is
    dropped or :meth:`discard`-ed uncommitted removes its staging file (the only file it wrote)."""

    def __init__(self, path: str | os.PathLike, rows: int, dim: int, dtype=np.float32):
        self.path = Path(path)
        self.rows, self.dim, self.dtype = int(rows), int(dim), np.dtype(dtype)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(self.path.parent, self.path.name)
        self.staged = staging_path(self.path)
        self._array = np.lib.format.open_memmap(self.staged, mode="w+", dtype=self.dtype, shape=(self.rows, self.dim))
        self._cleanup = weakref.finalize(self, _remove, str(self.staged))

    def write(self, rows, vectors: np.ndarray) -> None:
        """Put ``vectors`` at ``rows`` (an index array or a slice)."""
        self._array[rows] = vectors

    def commit(self, path: str | os.PathLike | None = None) -> Path:
        """Flush the file and rename it to ``path`` (default: the path it was made for); returns where it is."""
        dest = Path(path) if path is not None else self.path
        self._array.flush()
        del self._array
        with open(self.staged, "rb") as f:
            os.fsync(f.fileno())
        os.replace(self.staged, dest)
        self._cleanup.detach()
        return dest

    def discard(self) -> None:
        """Remove the staging file (nothing was committed)."""
        self._array = None
        self._cleanup()


def open_vectors(path: str | os.PathLike, rows: int, dim: int | None = None, dtype=None) -> np.ndarray:
    """The ``.npy`` file at ``path`` memory-mapped read-only (constant time), after checking that it is a 2-D
    float32 or float16 array of ``rows`` rows (of ``dim`` columns, of ``dtype``, where given) whose file holds every
    byte its header promises. Anything else (a truncated or damaged file, other rows) is one
    :class:`~hf_cocodr.errors.ConfigError` line naming the file: it is never searched."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, file_dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, file_dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f".npy format version {version}, expected 1.0 or 2.0")
            offset = f.tell()
        size = path.stat().st_size
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing") from None
    except (ValueError, OSError, EOFError) as e:
        raise ConfigError(f"{path}: not a readable .npy file ({' '.join(str(e).split())[:200]})") from None
    if len(shape) != 2 or fortran or file_dtype not in (np.float32, np.float16):
        raise ConfigError(
            f"{path}: holds a {'Fortran-order ' if fortran else ''}{file_dtype} array of shape {shape}, expected "
            f"({rows}, dimension) float32 or float16 vectors"
        )
    if shape[0] != rows or (dim is not None and shape[1] != dim):
        raise ConfigError(f"{path}: {shape[0]} vectors of dimension {shape[1]}, expected {rows} of dimension {dim}")
    if dtype is not None and file_dtype != np.dtype(dtype):
        raise ConfigError(f"{path}: {file_dtype} vectors, expected {np.dtype(dtype)}")
    need = offset + shape[0] * shape[1] * file_dtype.itemsize
    if size != need:
        raise ConfigError(
            f"{path}: {size} bytes where its header ({shape[0]} x {shape[1]} {file_dtype}) needs {need}: the file is "
            f"{'truncated' if size < need else 'longer than its vectors'}; it is not searched"
        )
    if shape[0] == 0:
        return np.zeros(shape, file_dtype)
    return np.load(path, mmap_mode="r", allow_pickle=False)


class MappedIndex:
    """Exact inner-product search over vectors held on disk (or any 2-D array): the same ``search`` /
    ``reconstruct_all`` as :class:`~hf_cocodr.retrieval.index.DenseIndex`, reading the vectors in blocks of about
    32 MiB (as float32) and merging each block's top-``k`` into a running one, so memory is one block and one block's
    scores, whatever the number of vectors. Each block is scored as the exact index scores it (faiss's exhaustive
    inner-product search when faiss is installed, bit for bit the scores of ``IndexFlatIP``; else a torch matrix
    product, as the torch backend), so its results are exact search's; equal scores are ordered by row. A block with a NaN or infinite value is refused with one line naming
    ``name`` (the file) and nothing is returned.

    Args:
        vectors: a ``(n, dim)`` float32 or float16 array (:func:`open_vectors`'s memory map).
        name: what the vectors are, for the error that refuses them.
        block_rows: rows per block (default: 32 MiB of float32 rows).
        backend: ``"auto"`` (faiss when installed, else torch), ``"faiss"`` or ``"torch"``, as for ``DenseIndex``.
    """

    def __init__(
        self, vectors: np.ndarray, name: str | None = None, block_rows: int | None = None, backend: str = "auto"
    ):
        from .index import _want_faiss

        self.use_faiss = _want_faiss(backend)
        self.backend = "faiss" if self.use_faiss else "torch"
        if vectors.ndim != 2:
            raise ValueError(f"expected (n, dim) vectors, got shape {vectors.shape}")
        self.vectors = vectors
        self.ntotal, self.dim = (int(s) for s in vectors.shape)
        self.name = name or "the vectors"
        self.block_rows = int(block_rows or max(1024, BLOCK_BYTES // (4 * max(1, self.dim))))

    def _block(self, start: int) -> np.ndarray:
        block = np.array(self.vectors[start : start + self.block_rows], dtype=np.float32)
        if not np.isfinite(block).all():
            row = start + int(np.flatnonzero(~np.isfinite(block).all(axis=1))[0])
            raise ConfigError(
                f"{self.name}: vector {row} is not finite (NaN or inf); the file is damaged: nothing is searched in "
                "it, build it again"
            )
        return block

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` by inner product: ``(scores, rows)`` of shape ``(n_queries, min(k, ntotal))``, best first."""
        from .index import _as_f32_numpy

        q = _as_f32_numpy(queries)
        k = min(int(k), self.ntotal)
        best_s = np.full((len(q), k), -np.inf, np.float32)
        best_i = np.full((len(q), k), -1, np.int64)
        if k == 0 or not len(q):
            return best_s, best_i
        q_batch = max(1, SCORES_BYTES // (4 * self.block_rows))
        for start in range(0, self.ntotal, self.block_rows):
            block = self._block(start)
            kb = min(k, len(block))
            for s in range(0, len(q), q_batch):
                top_s, top_i = self._block_top(q[s : s + q_batch], block, kb)
                cand_s = np.concatenate([best_s[s : s + q_batch], top_s], axis=1)
                cand_i = np.concatenate([best_i[s : s + q_batch], top_i + start], axis=1)
                # best first, equal scores by row (the -1 placeholders of a first short block sort last)
                keep = np.lexsort((np.where(cand_i < 0, np.iinfo(np.int64).max, cand_i), -cand_s), axis=1)[:, :k]
                best_s[s : s + q_batch] = np.take_along_axis(cand_s, keep, axis=1)
                best_i[s : s + q_batch] = np.take_along_axis(cand_i, keep, axis=1)
        return best_s, best_i

    def _block_top(self, q: np.ndarray, block: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.use_faiss:
            import faiss

            scores, rows = faiss.knn(q, block, k, metric=faiss.METRIC_INNER_PRODUCT)
            return scores, rows.astype(np.int64)
        import torch

        top = torch.topk(torch.from_numpy(q) @ torch.from_numpy(block).T, k, dim=1, sorted=False)
        return top.values.numpy(), top.indices.numpy()

    def reconstruct_all(self) -> np.ndarray:
        """Every vector as a float32 array in memory (the whole corpus: for callers that need it so)."""
        return np.asarray(self.vectors, dtype=np.float32).copy()
