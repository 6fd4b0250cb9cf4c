"""Payload codecs: how a policy snapshot travels as a flat dict of numpy arrays, and comes back.

    arrays, manifest = encode(state, codec="nvfp4", quantize=names)    # learner side
    state            = decode(arrays, manifest)                        # explorer side

- `dense`: every tensor as is (bf16 travels as its uint16 bit pattern: numpy has no bfloat16).
- `nvfp4`: the tensors named in `quantize` as packed NVFP4 — 4-bit codes two per byte, E4M3 block
  scales (as uint8 bit patterns), one FP32 tensor scale — ≈ 4.5 bits per element; the rest dense.
  A 1×1 convolution weight `[out, in, 1, 1]` is packed as the `[out, in]` matrix the engine runs (its
  blocks along `in`) and decoded back to its shape. Decoding yields exactly the engine's
  fake-quantized values (`nvfp4_fake_quant` of that matrix), bit for bit.
- `lora`: the sampling adapter's tensors only (a few MB); the explorer merges them into its base.
Numpy arrays, not tensors, because Ray's object store maps numpy zero-copy in every reader on a
node, while a torch tensor is pickled and copied (docs/benchmarks.md, "Weight sync and the cluster").
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal, get_args

import numpy as np
import torch

from diffusion.quant import NVFP4Packed, nvfp4_dequantize, nvfp4_quantize

Codec = Literal["dense", "nvfp4", "lora"]
CODECS: tuple[str, ...] = get_args(Codec)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64,
           "uint8": torch.uint8}


@dataclass(frozen=True)
class Entry:
    """One tensor of a snapshot: how it was encoded and the checksum of its encoded bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # the torch dtype it decodes to
    codec: str  # "dense" or "nvfp4" for this entry
    checksum: str  # CRC-32 over the entry's arrays, in order


@dataclass(frozen=True)
class Manifest:
    version: int
    codec: str
    entries: tuple[Entry, ...]
    meta: dict = field(default_factory=dict)  # JSON-able extras, e.g. {"lora_scale": 2.0}

    def to_json(self) -> dict:
        return {"version": self.version, "codec": self.codec, "entries": [asdict(e) for e in self.entries],
                "meta": dict(self.meta)}

    @classmethod
    def from_json(cls, data: dict) -> Manifest:
        entries = tuple(Entry(e["name"], tuple(e["shape"]), e["dtype"], e["codec"], e["checksum"])
                        for e in data["entries"])
        return cls(int(data["version"]), data["codec"], entries, dict(data.get("meta", {})))


def _checksum(arrays: Iterable[np.ndarray]) -> str:
    """CRC-32 chained over the arrays' bytes: it catches torn, truncated or mixed snapshots (not
    tampering), and zlib's CRC-32 is several times faster than a cryptographic hash (blake2b), so
    verifying costs little next to the copy (docs/benchmarks.md, "Weight sync and the cluster")."""
    crc = 0
    for array in arrays:
        crc = zlib.crc32(np.ascontiguousarray(array).view(np.uint8).data, crc)
    return f"{crc:08x}"


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().contiguous().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy()
    if tensor.dtype == torch.float8_e4m3fn:
        return tensor.view(torch.uint8).numpy()
    return tensor.numpy()


def _from_numpy(array: np.ndarray, dtype: str) -> torch.Tensor:
    """Zero-copy view; object-store arrays are read-only, and the consumer only copies out of them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(array)
    if dtype == "bfloat16":
        return tensor.view(torch.bfloat16)
    return tensor


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"cannot encode dtype {dtype}; supported: {', '.join(_DTYPES)}")
    return name


def _gemm_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a weight is NVFP4-packed in: a 1×1 conv's `[out, in, 1, 1]` as its GEMM's `[out, in]`
    (NVFP4 blocks run along the last dim, which must be the input channels), anything else as is."""
    if len(shape) == 4 and shape[2:] == (1, 1):
        return shape[:2]
    return shape


def encode(
    state: Mapping[str, torch.Tensor],
    codec: Codec,
    *,
    version: int,
    quantize: Iterable[str] = (),
    meta: dict | None = None,
    checksums: bool = True,
) -> tuple[dict[str, np.ndarray], Manifest]:
    """A snapshot as flat numpy arrays ("<name>" or "<name>/codes|scales|global") and its manifest.

    checksums=False leaves them empty (decode then cannot verify): Ray objects are immutable, so they
    guard against bugs, not against tearing, and cost one pass over the bytes on each side.
    """
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}: choose one of {', '.join(CODECS)}")
    quantized = set(quantize) if codec == "nvfp4" else set()
    unknown = quantized - state.keys()
    if unknown:
        raise KeyError(f"asked to quantize {sorted(unknown)[:3]}, which the state does not hold")
    arrays: dict[str, np.ndarray] = {}
    entries = []
    for name, tensor in state.items():
        if name in quantized:
            packed = nvfp4_quantize(tensor.detach().cpu().reshape(_gemm_shape(tuple(tensor.shape))))
            parts = {f"{name}/codes": _to_numpy(packed.codes), f"{name}/scales": _to_numpy(packed.block_scales),
                     f"{name}/global": _to_numpy(packed.global_scale.reshape(1))}
            kind = "nvfp4"
        else:
            parts = {name: _to_numpy(tensor)}
            kind = "dense"
        arrays.update(parts)
        checksum = _checksum(parts.values()) if checksums else ""
        entries.append(Entry(name, tuple(tensor.shape), _dtype_name(tensor.dtype), kind, checksum))
    return arrays, Manifest(version, codec, tuple(entries), dict(meta or {}))


class CorruptSnapshot(RuntimeError):
    """A snapshot whose bytes do not match its manifest (torn, truncated or mixed versions)."""


def decode(arrays: Mapping[str, np.ndarray], manifest: Manifest, *, verify: bool = True) -> dict[str, torch.Tensor]:
    """Tensors by name; with verify, every entry's checksum is checked first (CorruptSnapshot if not)."""
    out: dict[str, torch.Tensor] = {}
    for entry in manifest.entries:
        keys = [f"{entry.name}/codes", f"{entry.name}/scales", f"{entry.name}/global"] \
            if entry.codec == "nvfp4" else [entry.name]
        missing = [k for k in keys if k not in arrays]
        if missing:
            raise CorruptSnapshot(f"snapshot v{manifest.version} lacks {missing[0]!r} named by its manifest")
        parts = [arrays[k] for k in keys]
        if verify and entry.checksum and _checksum(parts) != entry.checksum:
            raise CorruptSnapshot(f"snapshot v{manifest.version}: checksum mismatch for {entry.name!r}")
        if entry.codec == "nvfp4":
            packed = NVFP4Packed(
                codes=_from_numpy(parts[0], "uint8"),
                block_scales=_from_numpy(parts[1], "uint8").view(torch.float8_e4m3fn),
                global_scale=_from_numpy(parts[2], "float32").reshape(()),
                shape=torch.Size(_gemm_shape(entry.shape)),
                dtype=_DTYPES[entry.dtype],
            )
            out[entry.name] = nvfp4_dequantize(packed).reshape(entry.shape)
        else:
            out[entry.name] = _from_numpy(parts[0], entry.dtype).reshape(entry.shape)
    return out


def payload_bytes(arrays: Mapping[str, np.ndarray]) -> int:
    return sum(a.nbytes for a in arrays.values())
