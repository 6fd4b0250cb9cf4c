"""Where a reward model runs: its device and its dtype, from the `device` and `dtype` options."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """None → "cuda" when CUDA is available, else "cpu"."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:N', got {device!r}") from error


def resolve_dtype(dtype: str) -> torch.dtype:
    """"float32" | "float16" | "bfloat16" → the torch dtype."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]
