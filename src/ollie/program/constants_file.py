"""A program's ``constants.npz``: numpy's archive format, written aligned and read in place.

The file is what :func:`numpy.savez` writes (an uncompressed zip of one ``.npy`` per
constant), so numpy, and any zip tool, still reads it. Two things differ:

* :func:`save` pads each member's local header (an extra field of the zip format, which
  readers skip) so that its array data starts at a multiple of :data:`ALIGN` bytes, and
  replaces the file atomically (a new file renamed over the old one), so that a process
  still reading the old file in place keeps seeing it whole.
* :func:`load` maps the file into memory copy-on-write and returns arrays that view it: no
  read into freshly allocated memory, which costs far more than the read itself on a virtual
  machine whose first touch of a page is slow (docs/design/037-constants-in-place.md). The
  arrays are writable; a write copies the page it touches and never reaches the file. A member
  whose data is not aligned for its element type (files written before this layout) is copied
  out. Every member's CRC-32 is checked, as :mod:`zipfile` does when it reads.

Nothing is unpickled: a header naming an object dtype, a compressed member, a truncated or
malformed file raise :class:`~ollie.program.serialize.FormatError` naming the file and the member.
"""

from __future__ import annotations

import io
import mmap
import os
import struct
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import numpy as np

from ollie.errors import OllieError
from ollie.program.serialize import FormatError

ALIGN = 64
"""Byte alignment of every member's array data in a file written by :func:`save` (a cache
line; more than any element type needs)."""

_LOCAL = struct.Struct("<4s2B4HL2L2H")  # a zip local file header (30 bytes)
_PAD_ID = 0xA11E  # extra-field id of the padding (unregistered ids are skipped by readers)
_ZIP64_EXTRA = 20  # zipfile's zip64 extra field in a local header written with force_zip64


def save(path: str | Path, constants: Mapping[str, np.ndarray]) -> None:
    """Write ``constants`` to ``path`` as an uncompressed ``.npz`` whose array data are
    :data:`ALIGN`-aligned, replacing any file there atomically. Takes every name, unlike
    :func:`numpy.savez` (which takes them as keyword arguments)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fp, zipfile.ZipFile(fp, "w", compression=zipfile.ZIP_STORED,
                                                    allowZip64=True) as zf:
            for name, value in constants.items():
                info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_STORED
                info.extra = _padding(fp.tell() + _LOCAL.size + len(_encoded(info.filename))
                                      + _ZIP64_EXTRA)
                with zf.open(info, "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _encoded(name: str) -> bytes:
    """A member name's bytes in the zip headers, as :mod:`zipfile` encodes it."""
    try:
        return name.encode("ascii")
    except UnicodeEncodeError:
        return name.encode("utf-8")


def _padding(data_start: int) -> bytes:
    """An extra field that moves member data starting at ``data_start`` (without it) to a
    multiple of :data:`ALIGN`; ``.npy`` headers are themselves padded to 64 bytes."""
    pad = -(data_start + 4) % ALIGN
    return struct.pack("<HH", _PAD_ID, pad) + bytes(pad)


def load(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` at ``path`` by name (the member name without ``.npy``),
    viewing the file mapped copy-on-write where their data are aligned, copied otherwise.
    Raises :class:`~ollie.errors.OllieError` if the file cannot be read and
    :class:`~ollie.program.serialize.FormatError` if it is not a valid archive of numeric arrays."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            with zipfile.ZipFile(f) as z:
                infos = z.infolist()
            size = os.fstat(f.fileno()).st_size
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if infos else None
    except OSError as exc:
        raise OllieError(f"{path}: cannot read the program's constants ({exc})") from None
    except (ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise FormatError(f"{path}: not a valid constants archive ({str(exc)[:100]})") from None
    out: dict[str, np.ndarray] = {}
    if mm is None:  # no members
        return out
    for info in infos:
        where = f"{path}: member '{info.filename}'"
        if not info.filename.endswith(".npy"):
            raise FormatError(f"{where}: not a .npy array")
        out[info.filename[:-4]] = _member(mm, info, size, where)
    return out


def _member(mm: mmap.mmap, info: zipfile.ZipInfo, size: int, where: str) -> np.ndarray:
    """One member's array, viewing ``mm`` if aligned (see :func:`load`)."""
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        raise FormatError(f"{where}: compressed; Ollie writes constants uncompressed")
    start = info.header_offset
    if start + _LOCAL.size > size:
        raise FormatError(f"{where}: header beyond the end of the file")
    head = _LOCAL.unpack_from(mm, start)
    if head[0] != b"PK\x03\x04":
        raise FormatError(f"{where}: bad local header")
    data = start + _LOCAL.size + head[10] + head[11]  # name and extra field lengths
    end = data + info.file_size
    if end > size:
        raise FormatError(f"{where}: truncated")
    if zlib.crc32(memoryview(mm)[data:end]) != info.CRC:
        raise FormatError(f"{where}: CRC-32 mismatch (corrupted or modified)")
    f = io.BytesIO(mm[data:min(end, data + 65536)])
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    except (ValueError, SyntaxError, TypeError) as exc:
        raise FormatError(f"{where}: not a .npy array ({str(exc)[:100]})") from None
    if dtype.kind not in "biuf" or dtype.hasobject:
        raise FormatError(f"{where}: element type {dtype}")
    offset = data + f.tell()
    count = int(np.prod(shape, dtype=np.int64))
    if offset + count * dtype.itemsize != end:
        raise FormatError(f"{where}: {end - offset} bytes of data for shape {shape}")
    order: Literal["C", "F"] = "F" if fortran else "C"
    if offset % dtype.alignment == 0:
        return np.ndarray(shape, dtype, buffer=mm, offset=offset, order=order)
    flat = np.frombuffer(mm, dtype, count, offset).copy()
    return flat.reshape(shape, order=order)


__all__ = ["ALIGN", "load", "save"]
