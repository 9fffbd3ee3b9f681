"""Uncompressed .npz files read row by row and written chunk by chunk.

A feature file of 10^6 programs holds ~17 GB of step features (48 x 87 float32 a program): more
than a sampler may hold in memory (`tcl sample`'s target is 2 GB), though it reads each row only
a few times. An uncompressed .npz (what `np.savez` and `write_npz` write) stores each array as a
plain .npy inside the zip, so its rows can be read straight from the file:

    x = stored_rows(path, "x")      # StoredRows: shape / dtype like the array, nothing read yet
    x[a:b], x[index]                # np.ndarray of those rows, read with seek + readinto
    x.take(index)                   # a StoredRows view of those rows (still nothing read)
    write_npz(path, {"x": x, ...})  # any (N, ...) array-like is written `CHUNK_ROWS` rows at a time

The rows are read with plain file reads, never memory-mapped: a mapping's resident pages count
as the process's memory (and stay resident while the machine has room), whereas read() leaves
them to the page cache.
"""

from __future__ import annotations

import os
import struct
import zipfile
from pathlib import Path

import numpy as np

CHUNK_ROWS = 4096          # rows written at a time
_LOCAL_HEADER = 30         # fixed part of a zip local file header
_LOCAL_MAGIC = b"PK\x03\x04"


class StoredRows:
    """Rows of an (N, ...) C-order array stored uncompressed in a file at byte `offset`, read on
    demand. `rows` (None: all, in order) are the stored rows this view holds, in its order."""

    def __init__(self, path: str | os.PathLike, offset: int, shape: tuple, dtype, rows: np.ndarray | None = None):
        self.path = Path(path)
        self.offset = int(offset)
        self.dtype = np.dtype(dtype)
        self.stored_shape = tuple(int(s) for s in shape)
        self.rows = None if rows is None else np.asarray(rows, np.int64)
        self.row_bytes = int(np.prod(self.stored_shape[1:], dtype=np.int64)) * self.dtype.itemsize

    @property
    def shape(self) -> tuple:
        n = self.stored_shape[0] if self.rows is None else len(self.rows)
        return (n, *self.stored_shape[1:])

    @property
    def ndim(self) -> int:
        return len(self.stored_shape)

    @property
    def nbytes(self) -> int:
        return len(self) * self.row_bytes

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"StoredRows({str(self.path)!r}, shape={self.shape}, dtype={self.dtype})"

    def _stored(self, key) -> np.ndarray:
        """The stored row numbers of view positions `key` (slice, int array or bool mask)."""
        n = len(self)
        if isinstance(key, slice):
            pos = np.arange(*key.indices(n))
        else:
            pos = np.asarray(key)
            if pos.dtype == bool:
                if pos.shape != (n,):
                    raise IndexError(f"boolean index of shape {pos.shape} for {n} rows")
                pos = np.flatnonzero(pos)
            pos = pos.astype(np.int64, copy=False).reshape(-1)
            if len(pos) and (pos.min() < -n or pos.max() >= n):
                raise IndexError(f"row index out of range for {n} rows")
            pos = np.where(pos < 0, pos + n, pos)
        return pos if self.rows is None else self.rows[pos]

    def take(self, key, axis: int = 0) -> "StoredRows":
        """A view of rows `key` (in that order) that reads nothing until indexed; ``x.take(index,
        axis=0)`` as on an ndarray, so callers need not tell the two apart."""
        if axis != 0:
            raise ValueError("stored rows are taken along axis 0 only")
        return StoredRows(self.path, self.offset, self.stored_shape, self.dtype, self._stored(key))

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, (int, np.integer)):
            return self[np.asarray([key])][0]
        if isinstance(key, tuple):  # x[rows, ...]: read the rows, then index within them
            rows = self[key[0]]
            return rows[key[1:]] if isinstance(key[0], (int, np.integer)) else rows[(slice(None), *key[1:])]
        return self._read(self._stored(key))

    def __array__(self, dtype=None, copy=None):
        out = self[:]
        return out if dtype is None else out.astype(dtype, copy=False)

    def _read(self, stored: np.ndarray) -> np.ndarray:
        """Rows `stored` (any order, repeats allowed): one seek + read per run of consecutive rows."""
        order = np.argsort(stored, kind="stable")
        s = stored[order]
        out = np.empty((len(s), *self.stored_shape[1:]), self.dtype)
        if len(s):
            breaks = np.flatnonzero(np.diff(s) != 1) + 1
            with open(self.path, "rb") as f:
                for a, b in zip(np.r_[0, breaks], np.r_[breaks, len(s)]):
                    f.seek(self.offset + int(s[a]) * self.row_bytes)
                    want = (b - a) * self.row_bytes
                    got = f.readinto(memoryview(out[a:b].reshape(-1)).cast("B"))
                    if got != want:
                        raise ValueError(f"{self.path}: truncated (rows {s[a]}..{s[b - 1]}: "
                                         f"read {got} of {want} bytes)")
        if np.array_equal(order, np.arange(len(order))):
            return out
        ordered = np.empty_like(out)
        ordered[order] = out
        return ordered


def stored_rows(path: str | os.PathLike, name: str) -> StoredRows | None:
    """Member `name` (without .npy) of the .npz at `path` as StoredRows, or None where it cannot be
    read in place (compressed, Fortran order, object dtype, 0-d): load it whole instead.
    KeyError if the member is missing; ValueError naming the file if it is damaged."""
    path = Path(path)
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(f"{name}.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        head = f.read(_LOCAL_HEADER)
        if len(head) != _LOCAL_HEADER or head[:4] != _LOCAL_MAGIC:
            raise ValueError(f"{path}: damaged zip entry {name}.npy")
        name_len, extra_len = struct.unpack("<HH", head[26:30])
        start = info.header_offset + _LOCAL_HEADER + name_len + extra_len
        f.seek(start)
        version = np.lib.format.read_magic(f)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
            return None
        shape, fortran_order, dtype = read_header(f)
        offset = f.tell()
    if fortran_order or dtype.hasobject or len(shape) == 0:
        return None
    rows = StoredRows(path, offset, shape, dtype)
    if offset - start + rows.nbytes != info.file_size:
        raise ValueError(f"{path}: {name}.npy holds {info.file_size - (offset - start)} bytes of data, "
                         f"its header says {rows.nbytes}")
    return rows


def write_npz(f, arrays: dict) -> None:
    """Write `arrays` as an uncompressed .npz to the open binary file `f` (what `np.savez` writes).
    A value that is not an np.ndarray (StoredRows, or any (N, ...) array-like with shape, dtype
    and row slices) is written CHUNK_ROWS rows at a time, never whole in memory."""
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                if isinstance(value, np.ndarray) or np.isscalar(value):
                    np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
                    continue
                n, dtype = len(value), np.dtype(value.dtype)
                header = np.lib.format.header_data_from_array_1_0(np.empty((0, *value.shape[1:]), dtype))
                header["shape"] = (n, *value.shape[1:])
                np.lib.format.write_array_header_1_0(member, header)
                for a in range(0, n, CHUNK_ROWS):
                    chunk = np.ascontiguousarray(value[a:a + CHUNK_ROWS], dtype=dtype)
                    member.write(memoryview(chunk.reshape(-1)).cast("B"))
