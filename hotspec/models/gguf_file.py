"""The GGUF container: metadata and tensor records, read from a memory map in one pass.

gguf-py's GGUFReader slices a numpy memmap for every value, so a GGUF with a 150k-token
vocabulary (tokens, merges, token types: ~450k values) is slow to open before any weight is read.
This reads the same layout (GGUF v2/v3, little-endian: llama.cpp's `gguf.md`) with `struct`
over the mapped bytes; weights stay views of the map until they are dequantized with
gguf-py's `gguf.quants.dequantize`, exactly the arrays GGUFReader's tensors hold.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_SCALARS = {  # value type -> struct code
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}
_NUMPY = {  # tensor types stored as plain numbers (others are blocks of bytes)
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


class GGUFFormatError(ValueError):
    """The bytes are not a GGUF file this reader understands (what is wrong, and where)."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # GGUF's order: innermost dimension first
    tensor_type: GGMLQuantizationType
    data: np.ndarray  # numbers in numpy's order, or [..., bytes a row] for block types


@dataclass
class GGUFFile:
    version: int
    fields: dict[str, Any]  # key -> value (arrays as lists)
    types: dict[str, GGUFValueType]  # key -> its value's type (an array's: ARRAY)
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def take(self, code: str) -> Any:
        value = struct.unpack_from("<" + code, self.buf, self.pos)[0]
        self.pos += struct.calcsize(code)
        return value

    def string(self) -> str:
        n = self.take("Q")
        end = self.pos + n
        if end > len(self.buf):
            raise GGUFFormatError(f"a string of {n} bytes at byte {self.pos} runs past the file's end")
        s = bytes(self.buf[self.pos:end]).decode("utf-8", errors="replace")
        self.pos = end
        return s

    def value(self, vtype: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            etype, n = self.take("I"), self.take("Q")
            if etype == GGUFValueType.STRING:
                return [self.string() for _ in range(n)]
            if etype in _SCALARS:  # one numpy read for the whole array
                dt = np.dtype(bool if etype == GGUFValueType.BOOL else "<" + _SCALARS[etype])
                arr = np.frombuffer(self.buf, dt, n, self.pos)
                self.pos += n * dt.itemsize
                return arr.tolist()
            return [self.value(etype) for _ in range(n)]  # arrays of arrays
        code = _SCALARS.get(vtype)  # type: ignore[call-overload]
        if code is None:
            raise GGUFFormatError(f"unknown GGUF value type {vtype} at byte {self.pos}")
        return self.take(code)


def read_gguf_file(path: str | os.PathLike) -> GGUFFile:
    """Metadata and tensor records of a GGUF file; tensor data stays in the memory map."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise GGUFFormatError(f"{size} bytes is too short for a GGUF header")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    buf = memoryview(mm)
    if bytes(buf[:4]) != MAGIC:
        raise GGUFFormatError(f"the file starts with {bytes(buf[:4])!r}, not the GGUF magic {MAGIC!r}")
    if not struct.unpack_from("<I", buf, 4)[0] & 0xFFFF:  # the version's bytes read swapped
        raise GGUFFormatError("the file is big-endian; convert it with llama.cpp's "
                              "gguf_convert_endian.py (gguf-py) to little-endian")
    cur = _Cursor(buf)
    cur.pos = 4
    version = cur.take("I")
    if version not in VERSIONS:
        raise GGUFFormatError(f"GGUF version {version}; this reader reads versions {VERSIONS}")
    n_tensors, n_fields = cur.take("Q"), cur.take("Q")
    fields: dict[str, Any] = {}
    types: dict[str, GGUFValueType] = {}
    try:
        for _ in range(n_fields):
            key = cur.string()
            vtype = cur.take("I")
            fields[key] = cur.value(vtype)
            types[key] = GGUFValueType(vtype)
        records = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = tuple(cur.take("Q") for _ in range(cur.take("I")))
            records.append((name, dims, cur.take("I"), cur.take("Q")))
    except GGUFFormatError:
        raise
    except (struct.error, ValueError) as e:  # (a short read; numpy's is a ValueError)
        raise GGUFFormatError(f"the metadata ends early or is malformed, at byte {cur.pos} of "
                              f"{size} ({e})") from e
    align = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise GGUFFormatError(f"general.alignment is {align!r}, not a power of two")
    start = -(-cur.pos // align) * align
    whole = np.frombuffer(mm, np.uint8)
    tensors = [_tensor(whole, start, *r) for r in records]
    if len({t.name for t in tensors}) != len(tensors):
        raise GGUFFormatError("the file names a tensor twice")
    return GGUFFile(version, fields, types, tensors)


def _tensor(whole: np.ndarray, start: int, name: str, dims: tuple[int, ...], raw_type: int,
            offset: int) -> GGUFTensor:
    try:
        ttype = GGMLQuantizationType(raw_type)
    except ValueError as e:
        raise GGUFFormatError(f"tensor {name!r} has unknown type {raw_type}") from e
    block, type_size = GGML_QUANT_SIZES[ttype]
    n = int(np.prod(dims)) if dims else 1
    nbytes = n * type_size // block
    begin = start + offset
    if begin + nbytes > whole.size:
        raise GGUFFormatError(f"tensor {name!r} ({nbytes} bytes at {begin}) runs past the file's "
                              f"end ({whole.size} bytes): the file is truncated")
    raw = whole[begin:begin + nbytes]
    shape = tuple(reversed(dims))
    if ttype in _NUMPY:
        data = raw.view(_NUMPY[ttype]).reshape(shape)
    else:
        data = raw.reshape(*shape[:-1], shape[-1] // block * type_size)
    return GGUFTensor(name, dims, ttype, data)
