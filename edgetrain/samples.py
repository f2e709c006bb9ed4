"""A user's samples on disk, read a few rows at a time: the data set is never held in memory.

`read_npz(path)` opens an `.npz` of `x` and `y` (as `np.savez` writes it) and returns two
SampleArrays. An array stored uncompressed in the dtype the runtime trains in (x float32, y
int64, C order) is read in place, straight from the archive; any other (compressed, float64,
int32 labels) is converted once, a block at a time, into an anonymous temporary file in the
system temporary folder (TMPDIR), which the kernel deletes when the process ends, even on a
kill. Either way every byte is read once up front, in blocks of BLOCK_BYTES, to check it
(checksum, NaN/Inf, labels in range); afterwards a micro-batch reads just its rows (os.pread),
so what the process holds of the data does not grow with the number of samples.

Nothing in an archive is trusted: an npy header must agree with the bytes the archive holds
(a header claiming 10^15 elements is refused before anything is allocated), a compressed
member may not claim to inflate beyond what deflate can reach, and object arrays are refused.
"""
from __future__ import annotations

import os
import shutil
import struct
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

from edgetrain.atomicfile import WriteError

BLOCK_BYTES = 1 << 20  # rows read per block when a whole array is scanned or converted
MAX_DEFLATE_RATIO = 1032  # deflate cannot inflate further (zlib's documented limit)
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... file name length, extra length


class DataError(ValueError):
    """User data that the runtime cannot train on, with what is wrong and how to fix it."""


class SampleArray:
    """Rows [N, *row_shape] of a little-endian C-order array at `offset` in an open file."""

    def __init__(self, f, offset: int, shape: tuple[int, ...], dtype, where: str):
        self._f, self._fd = f, f.fileno()  # f stays referenced: the descriptor stays open
        self.offset, self.shape, self.dtype = offset, tuple(shape), np.dtype(dtype)
        self.where = where
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def _rows(self, lo: int, hi: int) -> np.ndarray:
        n = (hi - lo) * self.row_bytes
        buf = os.pread(self._fd, n, self.offset + lo * self.row_bytes)
        if len(buf) != n:
            raise DataError(f"{self.where} ended early (rows {lo}..{hi - 1} are missing): the "
                            "file was truncated while in use; restore it and run again")
        return np.frombuffer(buf, self.dtype).reshape(hi - lo, *self.shape[1:])

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            i = int(key) + (len(self) if key < 0 else 0)
            if not 0 <= i < len(self):
                raise IndexError(f"row {key} of {len(self)}")
            return self._rows(i, i + 1)[0]
        if isinstance(key, slice):
            lo, hi, step = key.indices(len(self))
            if step != 1:
                raise IndexError("SampleArray slices take step 1")
            return self._rows(lo, max(lo, hi))
        idx = np.asarray(key, dtype=np.int64).reshape(-1)
        out = np.empty((len(idx), *self.shape[1:]), self.dtype)
        for k, i in enumerate(idx):
            out[k] = self[i]
        return out


class Rows:
    """Chosen rows of an array or SampleArray (a validation slice, the labelled windows),
    without copying them: row i is base[index[i]]."""

    def __init__(self, base, index):
        self.base, self.index = base, np.asarray(index, np.int64)
        self.shape = (len(self.index), *base.shape[1:])
        self.dtype = base.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            return self.base[int(self.index[key])]
        return np.asarray(self.base[self.index[key]])


def blocks(a, block_bytes: int = BLOCK_BYTES):
    """(first row, rows) of an array or SampleArray, about block_bytes at a time."""
    row = max(1, int(np.prod(a.shape[1:], dtype=np.int64)) * np.dtype(a.dtype).itemsize)
    step = max(1, block_bytes // row)
    for lo in range(0, len(a), step):
        yield lo, np.asarray(a[lo:lo + step])


def _npy_header(stream, where: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, header bytes) of the npy file starting at stream's position."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(stream)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read(stream)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(f"{where} is not a readable npy array ({e})") from e
    if dtype.hasobject:
        raise DataError(f"{where} holds Python objects ({dtype}); edgetrain reads only "
                          "numeric arrays: save numbers with np.savez")
    if fortran and len(shape) > 1:
        raise DataError(f"{where} is saved in Fortran order; save np.ascontiguousarray(x)")
    return tuple(int(d) for d in shape), dtype, stream.tell()


def read_npz(path: str | os.PathLike, names=("x", "y")) -> list[SampleArray]:
    """The named arrays of an .npz as SampleArrays (see the module docstring); DataError if
    the file is not an npz archive, misses an array, or disagrees with itself. Values are
    checked by the caller (edgetrain.data.check_xy) through `blocks`."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    with open(path, "rb") as f:
        magic = f.read(6)
    if not zipfile.is_zipfile(path):
        if magic.startswith(b"PK"):
            raise DataError(f"{path} is a truncated or damaged .npz archive; save it again")
        hint = (" (it is a single .npy array: save x and y together with np.savez)"
                if magic == b"\x93NUMPY" else "")
        raise DataError(f"{path} is not a .npz archive{hint}")
    try:
        zf = zipfile.ZipFile(path)
        members = {i.filename[:-4]: i for i in zf.infolist() if i.filename.endswith(".npy")}
        missing = [n for n in names if n not in members]
        if missing:
            raise DataError(f"{path} must hold arrays named {' and '.join(map(repr, names))}; "
                              f"it holds {sorted(members)}")
        return [_member(zf, path, members[n], f"{path}[{n}]", "f" if n == "x" else "i")
                for n in names]
    except DataError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as e:
        raise DataError(f"{path} is not a readable .npz file ({e}); save it again with "
                          "np.savez") from e


def _member(zf: zipfile.ZipFile, path: Path, info: zipfile.ZipInfo, where: str,
            kind: str) -> SampleArray:
    if info.compress_type != zipfile.ZIP_STORED and (
            info.file_size > MAX_DEFLATE_RATIO * info.compress_size + 65536):
        raise DataError(f"{where} claims {info.file_size:,} bytes from {info.compress_size:,} "
                          "compressed, more than deflate can produce: the archive is corrupt")
    with zf.open(info) as s:
        shape, dtype, header = _npy_header(s, where)
    if dtype.kind not in ("f" if kind == "f" else "iu"):
        raise DataError(f"{where} has dtype {dtype}, expected " + (
            "a float array" if kind == "f" else "integer class labels" if where.endswith(
                "[y]") else "integers"))
    if not shape:
        raise DataError(f"{where} is a scalar; expected one row per sample")
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if nbytes != info.file_size - header:
        raise DataError(f"{where}: its header says {list(shape)} {dtype} ({nbytes:,} bytes), "
                          f"the archive holds {info.file_size - header:,}: truncated or "
                          "corrupt; save it again")
    target = np.dtype(np.float32 if kind == "f" else np.int64)
    if info.compress_type == zipfile.ZIP_STORED and dtype == target.newbyteorder("<"):
        f = open(path, "rb")
        name_len, extra_len = _LOCAL_HEADER.unpack(os.pread(f.fileno(), 30, info.header_offset))[1:]
        start = info.header_offset + 30 + name_len + extra_len
        crc = 0
        for lo in range(0, info.file_size, BLOCK_BYTES):
            crc = zlib.crc32(os.pread(f.fileno(), min(BLOCK_BYTES, info.file_size - lo),
                                      start + lo), crc)
        if crc != info.CRC:
            raise DataError(f"{where} fails its checksum (CRC-32): the file is corrupt")
        return SampleArray(f, start + header, shape, target, where)
    return _spool(zf, info, shape, dtype, header, target, where)


def _spool(zf, info, shape, dtype, header, target, where) -> SampleArray:
    """Convert a member to `target` rows in an anonymous temporary file, a block at a time."""
    folder = tempfile.gettempdir()
    need = int(np.prod(shape, dtype=object)) * target.itemsize
    free = shutil.disk_usage(folder).free
    if need > free:
        raise WriteError(Path(folder) / "(temporary)", OSError(28, "No space left on device"),
                         f"converting {where} needs {need:,} bytes of temporary space; set "
                         "TMPDIR to a larger disk, or save x as float32 and y as int64 with "
                         "np.savez (uncompressed), which is read in place")
    f = tempfile.TemporaryFile(dir=folder)
    row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    step = max(1, BLOCK_BYTES // max(1, row))
    with zf.open(info) as s:
        s.read(header)
        for lo in range(0, shape[0], step):
            n = min(step, shape[0] - lo)
            raw = s.read(n * row)
            if len(raw) != n * row:
                raise DataError(f"{where} ended early: truncated or corrupt; save it again")
            values = np.frombuffer(raw, dtype)
            if target.kind == "f" and dtype.itemsize > target.itemsize:
                refuse_beyond_float32(values, where)
            f.write(values.astype(target).tobytes())
        s.read()  # to the end: zipfile checks the CRC-32 there
    f.flush()
    return SampleArray(f, 0, shape, target, where)


def refuse_beyond_float32(values: np.ndarray, where: str) -> None:
    """DataError if a finite value would become infinite once cast to float32."""
    big = float(np.abs(values[np.isfinite(values)]).max(initial=0.0))
    if big > np.finfo(np.float32).max:  # finite here, infinite once cast for the runtime
        raise DataError(f"{where} holds a value of magnitude {big:.3g}, beyond float32's "
                        f"range ({np.finfo(np.float32).max:.3g}); the runtime trains in "
                        "float32: scale or repair those samples")


# Above this, float32 training overflows: a BatchNorm variance or a sum of squares of 1e20 is
# past float32's 3.4e38, and the run diverges with a NaN loss. 1e15 leaves a layer's sums room.
MAX_INPUT_MAGNITUDE = 1e15


def refuse_untrainable_magnitude(values: np.ndarray, where: str, first: int = 0) -> None:
    """DataError if a value is so large that float32 training would overflow on it."""
    big = np.abs(values) > MAX_INPUT_MAGNITUDE
    if big.any():
        at = np.argwhere(big)[0]
        at[0] += first
        raise DataError(f"{where} holds a value of magnitude {float(np.abs(values).max()):.3g} "
                        f"(the first beyond {MAX_INPUT_MAGNITUDE:.0e} at index "
                        f"{tuple(int(i) for i in at)}); float32 training squares and sums "
                        "such values past float32's range and diverges: rescale the samples "
                        "(e.g. to physical units) or drop those")
