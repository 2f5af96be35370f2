"""A fit's logits as blocks of rows: from memory or from disk, the same blocks, and never an (N, K) copy.

At 50,000 x 21,843 float32 (4.4 GB) a float64 copy of the logits, or one of ``z - max z``, is 4-9 GB more; from a file
larger than memory there is no array at all. So the calibrators that can (``Calibrator.fits_in_blocks``) fit on a
:class:`FitRows`: the checked logits (an in-memory array or a :class:`~hf_calibration._core.disk_logits.DiskLogits`), the
rows kept (``ignore_index``), and how the map sees them (log-probabilities for probabilities; ``z - max_k z_k`` unless
the calibrator is shift-invariant). ``blocks()`` hands the kernels ``BLOCK_ELEMENTS`` values at a time: views of an
in-memory array where nothing needs computing, else rows computed into one reused buffer.

The blocks are cut at the same source rows whatever the source (every ``max(1, BLOCK_ELEMENTS // K)`` rows), and every
kernel adds its per-block results in block order (and within a block, in fixed chunks of rows), so a fit from disk
equals the fit in memory bit for bit, whatever the number of threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from hf_calibration._core.checks import to_numpy
from hf_calibration._core.disk_logits import DiskLogits, as_disk_logits
from hf_calibration._core.finite import first_non_finite

__all__ = ["BLOCK_ELEMENTS", "FitRows", "as_source", "first_non_finite"]

BLOCK_ELEMENTS = (
    1 << 22
)  # values per block (16 MB of float32): small enough to stay cheap, large enough to amortise a call


def as_source(logits: Any) -> np.ndarray | DiskLogits:
    """What a block fit reads: a ``DiskLogits`` (also for a file-backed ``np.memmap``) or a numpy array in native byte
    order whose dtype the kernels read (float32 / float64; float16 and bfloat16 become float32, exactly)."""
    disk = as_disk_logits(logits)
    if disk is not None:
        return disk
    x = to_numpy(logits, "logits")
    if x.dtype.kind == "f":
        if not x.dtype.isnative:
            x = x.astype(x.dtype.newbyteorder("="))
        if x.dtype not in (np.float32, np.float64):
            x = x.astype(np.float32)
    return x


class FitRows:
    """The (N, K) rows a fit reads, from an in-memory array or a ``DiskLogits``, in blocks (see the module docstring).

    Args:
        source: a native float32 / float64 numpy array (any layout) or a ``DiskLogits``.
        keep: boolean (N_source,) mask of the rows to fit on (``ignore_index``), or None for all.
        log_probabilities: the rows are probabilities: the map sees ``log(p)`` (a zero as the dtype's smallest normal).
        canonical: the map sees ``z - max_k z_k`` (calibrators that are not shift-invariant).

    ``raw_blocks()`` gives the kept rows as stored (for the checks); ``blocks()`` as the map sees them, in the compute
    dtype (float64 for float64 input, else float32). ``shape`` is (kept rows, K).
    """

    ndim = 2

    def __init__(
        self,
        source: np.ndarray | DiskLogits,
        keep: np.ndarray | None = None,
        *,
        log_probabilities: bool = False,
        canonical: bool = False,
    ):
        self.source = source
        n_source, k = source.shape
        self.keep = None if keep is None or bool(np.all(keep)) else np.asarray(keep, dtype=bool)
        self.kept = np.flatnonzero(self.keep) if self.keep is not None else None  # kept row -> source row
        self.shape = (n_source if self.keep is None else int(self.kept.shape[0]), k)
        self.dtype = np.dtype(source.dtype).newbyteorder("=")
        self.compute_dtype = np.dtype(np.float64 if self.dtype.itemsize >= 8 else np.float32)
        self.log_probabilities, self.canonical = log_probabilities, canonical
        self.rows_per_block = max(1, BLOCK_ELEMENTS // k)

    @classmethod
    def prepared(cls, z: np.ndarray) -> FitRows:
        """Rows already as the map sees them (what ``Calibrator._fit_inputs`` returns): read as they are."""
        return cls(z)

    def view(self, *, log_probabilities: bool, canonical: bool) -> FitRows:
        """The same rows seen another way (the source is shared, not copied)."""
        out = FitRows.__new__(FitRows)
        out.__dict__.update(self.__dict__)
        out.log_probabilities, out.canonical = log_probabilities, canonical
        return out

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def in_memory(self) -> bool:
        return isinstance(self.source, np.ndarray)

    @property
    def computed(self) -> bool:
        """Whether ``blocks()`` computes rows (a transform, a dtype change, a file read) rather than viewing an array."""
        if not isinstance(self.source, np.ndarray) or self.log_probabilities or self.canonical or self.keep is not None:
            return True
        return self.source.dtype != self.compute_dtype or not self.source.flags.c_contiguous

    @property
    def num_blocks(self) -> int:
        return -(-self.source.shape[0] // self.rows_per_block)

    # ------------------------------------------------------------------ reading
    def raw_blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(first kept row, kept rows as stored)`` per block, in order; a block of a file is valid until the next."""
        step, n_source = self.rows_per_block, self.source.shape[0]
        if isinstance(self.source, DiskLogits):
            chunks = self.source.blocks(step)
        else:
            chunks = ((start, self.source[start : start + step]) for start in range(0, n_source, step))
        kept = 0
        for start, block in chunks:
            if self.keep is not None:
                block = block[self.keep[start : start + block.shape[0]]]
            if block.shape[0]:
                yield kept, block
            kept += block.shape[0]

    def blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(first kept row, (n, K) C-ordered rows as the map sees them)`` per block, in order; valid until the next."""
        buffer = None
        for start, raw in self.raw_blocks():
            if self._is_view(raw):
                yield start, raw
                continue
            if buffer is None:
                buffer = np.empty((min(self.rows_per_block, self.shape[0]), self.shape[1]), dtype=self.compute_dtype)
            yield start, self._transform(raw, buffer[: raw.shape[0]])

    def _is_view(self, raw: np.ndarray) -> bool:
        return (
            not self.log_probabilities
            and not self.canonical
            and raw.dtype == self.compute_dtype
            and raw.flags.c_contiguous
        )

    def _transform(self, raw: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``raw`` as the map sees it, written into ``out`` (same shape, compute dtype)."""
        if self.log_probabilities:
            np.maximum(raw, np.finfo(self.compute_dtype).tiny, out=out, casting="unsafe")
            np.log(out, out=out)
        else:
            out[...] = raw
        if self.canonical:
            out -= out.max(axis=1, keepdims=True)
        return out

    def rows(self, index: np.ndarray) -> np.ndarray:
        """The kept rows ``index`` (sorted), as the map sees them: a small (len(index), K) array."""
        source_rows = np.asarray(index, dtype=np.int64) if self.kept is None else self.kept[index]
        if isinstance(self.source, DiskLogits):
            raw = (
                np.stack([self.source.read(int(r), int(r) + 1)[0] for r in source_rows])
                if len(source_rows)
                else np.empty((0, self.shape[1]), self.source.native_dtype)
            )
        else:
            raw = self.source[source_rows]
        if self._is_view(raw):  # fancy indexing made a fresh copy already: as the map sees it
            return raw
        return self._transform(raw, np.empty(raw.shape, dtype=self.compute_dtype))

    def array(self) -> np.ndarray:
        """All the kept rows as the map sees them, in memory (for a method that cannot fit in blocks)."""
        out = np.empty(self.shape, dtype=self.compute_dtype)
        for start, block in self.blocks():
            out[start : start + block.shape[0]] = block
        return out

    def __getitem__(self, index: Any) -> np.ndarray:
        """Kept rows as stored (an int or a contiguous slice), for error messages."""
        if isinstance(index, (int, np.integer)):
            return np.asarray(self._raw_rows(np.array([int(index)]))[0])
        if isinstance(index, slice):
            start, stop, step = index.indices(self.shape[0])
            return self._raw_rows(np.arange(start, stop, step))
        raise TypeError(f"FitRows reads rows by an integer or a slice, not {index!r}.")

    def _raw_rows(self, index: np.ndarray) -> np.ndarray:
        source_rows = index if self.kept is None else self.kept[index]
        if isinstance(self.source, DiskLogits):
            return np.stack([self.source.read(int(r), int(r) + 1)[0] for r in source_rows])
        return np.asarray(self.source[source_rows])

    # ------------------------------------------------------------------ checks
    def first_non_finite(self) -> int:
        """The first kept row holding NaN or inf, or -1 (one pass over the rows as stored)."""
        for start, block in self.raw_blocks():
            bad = first_non_finite(np.ascontiguousarray(block, dtype=self.compute_dtype))
            if bad >= 0:
                return start + bad
        return -1

    def torch_blocks(self) -> Iterator[tuple[int, torch.Tensor]]:
        """``blocks()`` as CPU tensors (no copy)."""
        for start, block in self.blocks():
            yield start, torch.from_numpy(block)


class MappedRows:
    """The blocks of a ``FitRows`` passed through ``fn`` (block -> block of the same shape: SVS's features), for a fit
    that reads them many times: computed once and kept when the rows are in memory (one more array of the rows' size,
    in ``dtype``, default the compute dtype), computed again at every pass when they are read from disk. The blocks are
    the same either way, so the fits agree bit for bit. ``fn=None`` keeps the rows as they are (when they are computed:
    ``z - max z``, a dtype change)."""

    ndim = 2

    def __init__(self, rows, fn=None, *, keep: bool | None = None, dtype=None, keep_bytes: int | None = None):
        self.base, self.fn = rows, fn
        self.shape = rows.shape
        self.compute_dtype = np.dtype(rows.compute_dtype if dtype is None else dtype)
        self.in_memory = rows.in_memory
        keep = rows.in_memory and (fn is not None or rows.computed) if keep is None else keep
        self._kept: list[tuple[int, np.ndarray]] | None = None
        self._kept_rows = 0
        if keep:  # the leading blocks, up to ``keep_bytes``; the rest are computed again at every pass
            self._kept, held = [], 0
            for start, block in rows.blocks():
                size = block.shape[0] * block.shape[1] * self.compute_dtype.itemsize
                if keep_bytes is not None and held + size > keep_bytes:
                    break
                self._kept.append((start, self._map(block, copy=True)))
                held, self._kept_rows = held + size, start + block.shape[0]

    computed = True

    def __len__(self) -> int:
        return self.shape[0]

    def _map(self, block: np.ndarray, copy: bool) -> np.ndarray:
        if self.fn is None:
            return np.array(block, dtype=self.compute_dtype, copy=True) if copy else block
        return np.ascontiguousarray(self.fn(block), dtype=self.compute_dtype)

    def blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        if self._kept is not None:
            yield from self._kept
            if self._kept_rows == self.shape[0]:
                return
        for start, block in self.base.blocks():
            if start >= self._kept_rows:
                yield start, self._map(block, copy=False)

    def rows(self, index: np.ndarray) -> np.ndarray:
        """The rows ``index`` (sorted) through ``fn``."""
        return self._map(self.base.rows(index), copy=True)


def uncentred(rows):
    """``rows`` without the per-row centring (``z - max z``) of a ``FitRows`` view, for a pass that subtracts each row's
    maximum itself (the top-label pass, temperature scaling, vector scaling's map): the same numbers, bit for bit, as
    ``fl(fl(z - m) - 0)`` is ``fl(z - m)``, without a centred copy of every block."""
    if isinstance(rows, FitRows) and rows.canonical:
        return rows.view(log_probabilities=rows.log_probabilities, canonical=False)
    return rows


def as_rows(x):
    """``x`` if it is read in blocks (``FitRows``, ``MappedRows``), else an (N, K) array as ``FitRows``."""
    return x if hasattr(x, "blocks") else FitRows(np.ascontiguousarray(x))
