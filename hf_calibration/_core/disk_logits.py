"""Logits larger than memory: a file read a block of rows at a time, never whole.

:func:`open_logits` opens the (N, K) logits that :func:`hf_calibration.io.inference.predict_logits` writes with
``output=`` (or any file of these kinds) as a :class:`DiskLogits`:

* a ``.npy`` file (``np.save``, ``np.lib.format.open_memmap``); its labels, if any, in ``<name>_labels.npy`` beside it;
* a ``.safetensors`` file holding a ``logits`` tensor (and a ``labels`` one);
* a ``datasets`` dataset saved with ``save_to_disk`` (a folder, or a ``datasets.Dataset`` read from its Arrow files),
  with a ``logits`` column of fixed-length float vectors (and a ``label`` / ``labels`` column).

A ``np.memmap`` (``np.load(path, mmap_mode="r")``) given to a calibrator's ``fit`` is read the same way
(:func:`as_disk_logits`). Reads copy rows into a buffer the caller owns (``os.pread``-style file reads; Arrow files
through pyarrow's stream reader, one record batch at a time): a memory map would leave every page it touched in the
process's memory, 4 GB after one pass over a 4 GB file.

The calibrators that fit in blocks of rows (temperature scaling, vector scaling, SVS, ETS, SMART, histogram binning,
isotonic regression, the spline) take a ``DiskLogits`` (or a memory-mapped array) as their ``logits``, with the
labels stored beside it when ``labels`` is omitted; the result equals the fit on the same logits in memory.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DiskLogits", "LogitsWriter", "open_logits", "as_disk_logits"]

_SAFETENSORS_DTYPES = {"F16": "<f2", "F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4"}


class DiskLogits:
    """(N, K) float logits in a file, read by blocks of rows (``read``, ``blocks``); ``labels`` when stored beside them.

    Array-like where a fit needs it: ``shape``, ``dtype``, ``ndim``, ``len()``, and row slices (``x[a:b]`` reads those
    rows). ``np.asarray(x)`` reads the whole file into memory (only when it fits).
    """

    ndim = 2

    def __init__(
        self,
        path: str | os.PathLike,
        shape: tuple[int, int],
        dtype: Any,
        *,
        offset: int = 0,
        labels: np.ndarray | None = None,
        arrow_files: list[str] | None = None,
        column: str | None = None,
    ):
        self.path = Path(path)
        self.shape = (int(shape[0]), int(shape[1]))
        self.dtype = np.dtype(dtype)
        self.offset = int(offset)
        self.labels = labels
        self._arrow_files, self._column = arrow_files, column
        self._stamp = self._file_stamp()  # what the files were when opened: a fit reads them many times
        if self.dtype.kind != "f" or self.dtype.itemsize not in (2, 4, 8):
            raise TypeError(
                f"Expected `logits` in {str(self.path)!r} to be float16, float32 or float64, but they are {self.dtype}."
            )

    def __repr__(self) -> str:
        return f"DiskLogits({str(self.path)!r}, shape={self.shape}, dtype={self.dtype})"

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.dtype.itemsize

    @property
    def native_dtype(self) -> np.dtype:
        """The dtype rows are returned in (the stored one, in native byte order)."""
        return self.dtype.newbyteorder("=")

    def _file_stamp(self) -> list[tuple[int, int, int]]:
        """Size, modification time (ns) and inode of each file the rows come from."""
        stamps = []
        for name in self._arrow_files or [self.path]:
            st = os.stat(name)
            stamps.append((st.st_size, st.st_mtime_ns, st.st_ino))
        return stamps

    def check_unchanged(self) -> None:
        """Refuse to read on when a file changed since it was opened (rewritten, replaced or resized): a fit reads the
        rows many times, and passes over two versions of a file would mix them into a number neither gives."""
        try:
            now = self._file_stamp()
        except FileNotFoundError:
            now = None
        if now != self._stamp:
            raise ValueError(
                f"Expected the logits in {str(self.path)!r} to stay as they were while they are read, but the "
                "file changed since it was opened (its size, modification time or inode): a result computed "
                "over both versions would be neither's. Open it again (open_logits) once it is written."
            )

    def read(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``start:stop`` as a native-order array (into ``out``, C-contiguous (stop - start, K), if given)."""
        self.check_unchanged()
        start, stop = max(0, int(start)), min(self.shape[0], int(stop))
        if out is None:
            out = np.empty((max(0, stop - start), self.shape[1]), dtype=self.native_dtype)
        if stop <= start:
            return out[:0]
        if self._arrow_files is not None:
            for begin, block in self._arrow_batches(start, stop):
                out[begin - start : begin - start + block.shape[0]] = block
            return out
        row_bytes = self.shape[1] * self.dtype.itemsize
        view = out[: stop - start]
        with open(self.path, "rb", buffering=0) as f:
            f.seek(self.offset + start * row_bytes)
            buffer = memoryview(view.reshape(-1).view(np.uint8))
            done = 0
            while done < buffer.nbytes:  # a raw read may return fewer bytes than asked
                got = f.readinto(buffer[done:])
                if not got:
                    raise ValueError(
                        f"{str(self.path)!r} is shorter than its header says: it ends inside row "
                        f"{start + done // row_bytes} of {self.shape[0]}."
                    )
                done += got
        if not self.dtype.isnative:
            view.view(self.dtype.newbyteorder("=")).byteswap(inplace=True)  # stored big-endian: swap in place
        return view

    def blocks(self, rows: int, out: np.ndarray | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, rows start:start + rows)`` over the whole array in order, each read into ``out`` (reused) if given."""
        rows = max(1, int(rows))
        if out is None:
            out = np.empty((min(rows, self.shape[0]), self.shape[1]), dtype=self.native_dtype)
        if (
            self._arrow_files is not None
        ):  # one sequential pass over the record batches, regrouped into blocks of `rows`
            self.check_unchanged()
            filled, start = 0, 0
            for _, batch in self._arrow_batches(0, self.shape[0]):
                used = 0
                while used < batch.shape[0]:
                    take = min(rows - filled, batch.shape[0] - used)
                    out[filled : filled + take] = batch[used : used + take]
                    filled, used = filled + take, used + take
                    if filled == rows:
                        yield start, out[:filled]
                        start, filled = start + filled, 0
            if filled:
                yield start, out[:filled]
            return
        for start in range(0, self.shape[0], rows):
            yield start, self.read(start, start + rows, out)

    def _arrow_batches(self, start: int, stop: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(first row, (n, K) rows)`` of the Arrow record batches overlapping rows ``start:stop``, clipped to them."""
        import pyarrow as pa

        row = 0
        for name in self._arrow_files:
            with pa.OSFile(name, "rb") as source:
                reader = pa.ipc.open_stream(source)
                for batch in reader:
                    n = batch.num_rows
                    if row + n > start and row < stop:
                        values = _fixed_size_values(batch.column(self._column), self.shape[1], self.path, self._column)
                        lo, hi = max(start, row) - row, min(stop, row + n) - row
                        yield row + lo, values[lo:hi]
                    row += n
                    if row >= stop:
                        return

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, (int, np.integer)):
            i = int(index) + (self.shape[0] if index < 0 else 0)
            if not 0 <= i < self.shape[0]:
                raise IndexError(f"row {index} is out of range for {self.shape[0]} rows")
            return self.read(i, i + 1)[0]
        if isinstance(index, slice) and index.step in (None, 1):
            start, stop, _ = index.indices(self.shape[0])
            return self.read(start, stop)
        raise TypeError(
            f"DiskLogits reads rows by an integer or a contiguous slice, not {index!r}; "
            "np.asarray(logits) loads the whole array."
        )

    def __array__(self, dtype=None, copy=None):
        out = self.read(0, self.shape[0])
        return out if dtype is None else out.astype(dtype, copy=False)


def _fixed_size_values(column, k: int, path: Path, name: str) -> np.ndarray:
    """The (n, K) values of an Arrow fixed-size-list (or list) column chunk, without nulls, as numpy."""
    import pyarrow as pa

    if column.null_count:
        raise ValueError(
            f"Expected the `{name}` column of {str(path)!r} to have no missing rows, but {column.null_count} are null."
        )
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_fixed_size_list(column.type):
        values = column.flatten()
    elif pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        values = column.flatten()
        if len(values) != len(column) * k:
            raise ValueError(f"Expected every row of the `{name}` column of {str(path)!r} to hold K = {k} values.")
    else:
        raise TypeError(
            f"Expected the `{name}` column of {str(path)!r} to hold float vectors, but it is {column.type}."
        )
    return values.to_numpy(zero_copy_only=False).reshape(len(column), k)


def _npy(path: Path) -> DiskLogits:
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
    if len(shape) != 2:
        raise ValueError(f"Expected the logits in {str(path)!r} to have shape (N, K), but they have shape {shape}.")
    if fortran and shape[0] > 1 and shape[1] > 1:
        raise ValueError(
            f"{str(path)!r} stores its logits column by column (Fortran order): rows cannot be read in blocks. "
            "Save them in C order (np.save(path, np.ascontiguousarray(logits)))."
        )
    labels_path = path.with_name(path.stem + "_labels.npy")
    labels = np.load(labels_path) if labels_path.is_file() else None
    return DiskLogits(path, shape, dtype, offset=offset, labels=labels)


def _safetensors(path: Path, key: str | None) -> DiskLogits:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    tensors = {name: info for name, info in header.items() if name != "__metadata__"}
    key = key or ("logits" if "logits" in tensors else None)
    if key is None or key not in tensors:
        raise ValueError(f"Expected a tensor {key or 'logits'!r} in {str(path)!r}, but it holds {sorted(tensors)}.")
    info = tensors[key]
    if info["dtype"] not in _SAFETENSORS_DTYPES or _SAFETENSORS_DTYPES[info["dtype"]][1] != "f":
        raise TypeError(
            f"Expected the tensor {key!r} in {str(path)!r} to be float16, float32 or float64, but it is {info['dtype']}."
        )
    labels = None
    for name in ("labels", "label"):
        if name in tensors and tensors[name]["dtype"] in ("I64", "I32") and len(tensors[name]["shape"]) in (1, 2):
            lo, hi = tensors[name]["data_offsets"]
            with open(path, "rb") as f:
                f.seek(8 + size + lo)
                labels = np.frombuffer(f.read(hi - lo), dtype=_SAFETENSORS_DTYPES[tensors[name]["dtype"]]).astype(
                    np.int64
                )
            labels = labels.reshape(tensors[name]["shape"])  # (N,) class indices, or a multi-label head's (N, L)
            break
    if len(info["shape"]) != 2:
        raise ValueError(
            f"Expected the tensor {key!r} in {str(path)!r} to have shape (N, K), but it has shape {info['shape']}."
        )
    return DiskLogits(
        path,
        tuple(info["shape"]),
        _SAFETENSORS_DTYPES[info["dtype"]],
        offset=8 + size + info["data_offsets"][0],
        labels=labels,
    )


def _dataset(dataset: Any, column: str | None, where: Path) -> DiskLogits:
    column = column or "logits"
    if column not in dataset.column_names:
        raise ValueError(
            f"Expected a column {column!r} in the dataset {str(where)!r}, but it has {dataset.column_names}."
        )
    if getattr(dataset, "_indices", None) is not None:
        raise ValueError(
            f"The dataset {str(where)!r} is a selection (select / shuffle / filter) of its Arrow files: rows "
            "cannot be read in order from them. flatten_indices() it first."
        )
    files = [entry["filename"] for entry in dataset.cache_files]
    if not files:
        raise ValueError(
            f"The dataset {str(where)!r} is held in memory, not in Arrow files: pass its logits as an array "
            "(dataset.with_format('numpy')[column])."
        )
    feature = dataset.features[column]
    length = getattr(feature, "length", -1)
    inner = getattr(feature, "feature", None)
    if length is None or length < 2 or getattr(inner, "dtype", None) not in ("float16", "float32", "float64"):
        raise TypeError(
            f"Expected the {column!r} column of {str(where)!r} to hold fixed-length float vectors "
            f"(datasets.List(Value('float32'), length=K)), but it is {feature}."
        )
    labels = None
    for name in ("label", "labels"):
        if name in dataset.column_names:
            labels = np.asarray(dataset.with_format("numpy", columns=[name])[name], dtype=np.int64)
            break
    return DiskLogits(where, (len(dataset), length), inner.dtype, labels=labels, arrow_files=files, column=column)


def open_logits(path: Any, *, key: str | None = None) -> DiskLogits:
    """Open stored logits for block-by-block reading (nothing is loaded but the header and the labels).

    Args:
        path: a ``.npy`` or ``.safetensors`` file, a folder written by ``datasets.Dataset.save_to_disk``, or a
            ``datasets.Dataset`` backed by Arrow files.
        key: the safetensors tensor or the dataset column holding the logits (default ``"logits"``).

    Returns:
        a :class:`DiskLogits`; ``.labels`` holds the labels stored beside the logits (None if there are none).
    """
    if hasattr(path, "cache_files") and hasattr(path, "column_names"):  # a datasets.Dataset
        return _dataset(
            path, key, Path(path.cache_files[0]["filename"]).parent if path.cache_files else Path("<in memory>")
        )
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"Expected argument `path` to be a file or folder path or a datasets.Dataset, but got {type(path).__name__}."
        )
    path = Path(path)
    if path.is_dir():
        import datasets

        return _dataset(datasets.load_from_disk(str(path)), key, path)
    if not path.is_file():
        raise ValueError(
            f"Expected argument `path` to name a logits file or a saved dataset, but {str(path)!r} does not exist."
        )
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return _npy(path)
    if suffix == ".safetensors":
        return _safetensors(path, key)
    raise ValueError(
        f"Expected argument `path` to be a .npy or .safetensors file or a saved dataset folder, but got {str(path)!r}."
    )


def as_disk_logits(x: Any) -> DiskLogits | None:
    """A ``DiskLogits`` reading the file behind a C-ordered 2-D ``np.memmap`` (``np.load(..., mmap_mode="r")``), else
    None (also for a memmap that is not a plain row range of its file)."""
    if isinstance(x, DiskLogits):
        return x
    if not isinstance(x, np.memmap) or x.ndim != 2 or getattr(x, "filename", None) is None or not x.flags.c_contiguous:
        return None
    mm = getattr(x, "_mmap", None)
    if mm is None:
        return None
    start = np.frombuffer(mm, dtype=np.uint8).ctypes.data  # the map's first byte
    file_start = x.offset - x.offset % _allocation_granularity()  # where numpy's mmap begins in the file
    offset = file_start + (x.ctypes.data - start)
    return DiskLogits(x.filename, x.shape, x.dtype, offset=offset)


def _allocation_granularity() -> int:
    import mmap

    return mmap.ALLOCATIONGRANULARITY


# ----------------------------------------------------------------------------- writing, a batch of rows at a time
class LogitsWriter:
    """Writes (N, K) float32 logits a batch of rows at a time to ``path`` (what ``predict_logits(output=...)`` uses):

    * ``x.npy``: the logits, and the labels in ``x_labels.npy`` (read back with ``np.load(path, mmap_mode="r")``);
    * ``x.safetensors``: tensors ``logits`` and ``labels`` in one file;
    * any other path: a ``datasets`` dataset saved there (``save_to_disk``), columns ``logits`` (fixed-length float32
      vectors) and ``label``.

    The file is written under a temporary name and renamed when complete; nothing holds more than a batch in memory
    (a dataset is first written to a temporary Arrow cache, then saved: twice the disk traffic).
    """

    def __init__(
        self, path: str | os.PathLike, num_rows: int, num_classes: int, labels: np.ndarray, *, overwrite: bool = False
    ):
        self.path = Path(path)
        self.shape = (int(num_rows), int(num_classes))
        from hf_calibration._core.inputs import whole_labels

        self.labels = np.ascontiguousarray(
            whole_labels(labels, "labels"), dtype=np.int64
        )  # 1.7 is refused, not truncated
        if self.labels.ndim not in (1, 2) or self.labels.shape[0] != self.shape[0]:
            raise ValueError(
                f"Expected {self.shape[0]} labels of shape (N,) (class indices) or (N, L) (a multi-label "
                f"head's 0/1 labels), but got shape {self.labels.shape}."
            )
        self.kind = {".npy": "npy", ".safetensors": "safetensors"}.get(self.path.suffix.lower(), "dataset")
        targets = [self.path] + ([self._labels_path()] if self.kind == "npy" else [])
        for target in targets:
            if target.exists() and not (target.is_dir() and not any(target.iterdir())) and not overwrite:
                raise ValueError(
                    f"Expected argument `output` to name a new file or folder, but {str(target)!r} exists; pass "
                    "overwrite=True to replace it."
                )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows = 0
        self._file = None
        self._batches: list[np.ndarray] = []
        if self.kind != "dataset":
            self._partial = self.path.with_name(f".{self.path.name}.partial")
            self._file = open(self._partial, "wb")
            self._write_header()
        else:
            import tempfile

            import datasets
            import pyarrow as pa

            self._queue: list[np.ndarray] = []
            self._written = 0
            self._cache = Path(tempfile.mkdtemp(prefix=".logits_", dir=self.path.parent))
            features = datasets.Features(
                {
                    "logits": datasets.List(datasets.Value("float32"), length=self.shape[1]),
                    "label": datasets.Value("int64")
                    if self.labels.ndim == 1
                    else datasets.List(datasets.Value("int64"), length=self.labels.shape[1]),
                }
            )
            self._schema = features.arrow_schema
            self._arrow = pa.ipc.new_stream(str(self._cache / "data.arrow"), self._schema)

    def _labels_path(self) -> Path:
        return self.path.with_name(self.path.stem + "_labels.npy")

    def _write_header(self) -> None:
        n, k = self.shape
        if self.kind == "npy":
            header = {"descr": "<f4", "fortran_order": False, "shape": (n, k)}
            np.lib.format.write_array_header_2_0(
                self._file, header
            ) if n * k >= 2**32 else np.lib.format.write_array_header_1_0(self._file, header)
            return
        logits_bytes = n * k * 4
        header = {
            "logits": {"dtype": "F32", "shape": [n, k], "data_offsets": [0, logits_bytes]},
            "labels": {
                "dtype": "I64",
                "shape": list(self.labels.shape),
                "data_offsets": [logits_bytes, logits_bytes + self.labels.size * 8],
            },
            "__metadata__": {"format": "np", "written_by": "hf_calibration.io.predict_logits"},
        }
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
        self._file.write(struct.pack("<Q", len(blob)))
        self._file.write(blob)

    def write(self, batch: np.ndarray) -> None:
        """Append the next rows (``(b, K)``, any float dtype: stored as float32)."""
        batch = np.ascontiguousarray(batch, dtype=np.dtype("<f4"))
        if batch.ndim != 2 or batch.shape[1] != self.shape[1] or self.rows + batch.shape[0] > self.shape[0]:
            raise ValueError(
                f"Expected batches of shape (b, {self.shape[1]}) adding up to {self.shape[0]} rows, but got "
                f"{batch.shape} after {self.rows} rows."
            )
        if self._file is not None:
            self._file.write(memoryview(batch.reshape(-1).view(np.uint8)))
        else:
            self._queue.append(batch.copy())
            if sum(b.shape[0] for b in self._queue) >= 1000:
                self._flush_queue()
        self.rows += batch.shape[0]

    def _flush_queue(self) -> None:
        import pyarrow as pa

        if not self._queue:
            return
        values = np.concatenate(self._queue)
        start = self._written
        column = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), self.shape[1])
        labels = self.labels[start : start + values.shape[0]]
        labels = (
            pa.array(labels)
            if labels.ndim == 1
            else pa.FixedSizeListArray.from_arrays(pa.array(labels.reshape(-1)), labels.shape[1])
        )
        table = pa.Table.from_arrays([column, labels], schema=self._schema)
        self._arrow.write_table(table)
        self._written += values.shape[0]
        self._queue = []

    def close(self):
        """Finish the file (rename it into place) and return what reads it back: a memory-mapped array for ``.npy``, a
        :class:`DiskLogits` otherwise."""
        if self.rows != self.shape[0]:
            raise ValueError(f"Expected {self.shape[0]} rows of logits, but {self.rows} were written.")
        if self.kind != "dataset":
            if self.kind == "safetensors":
                self._file.write(memoryview(self.labels.astype("<i8").view(np.uint8)))
            self._file.close()
            if self.kind == "npy":
                np.save(self._labels_path(), self.labels)
            os.replace(self._partial, self.path)
            if self.kind == "npy":
                return np.load(self.path, mmap_mode="r")
            return open_logits(self.path)
        return self._close_dataset()

    def _close_dataset(self) -> DiskLogits:
        import shutil

        self._flush_queue()
        self._arrow.close()
        import datasets

        dataset = datasets.Dataset.from_file(str(self._cache / "data.arrow"))
        if self.path.exists():
            shutil.rmtree(self.path)
        dataset.save_to_disk(str(self.path))
        del dataset
        shutil.rmtree(self._cache, ignore_errors=True)
        return open_logits(self.path)

    def abort(self) -> None:
        """Remove what was written (an error stopped the run)."""
        import shutil

        if self._file is not None:
            self._file.close()
            Path(self._partial).unlink(missing_ok=True)
        else:
            self._arrow.close()
            shutil.rmtree(self._cache, ignore_errors=True)
