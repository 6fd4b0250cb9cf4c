"""FP8 (E4M3) fake quantization as a pure tensor function, with one scale or a broadcast tensor of them."""

from __future__ import annotations

import torch

E4M3_MAX = 448.0

# modelopt treats an amax at or below 2^-24 as "no range" and quantizes with amax = 1 instead.
_AMAX_EPSILON = 2.0**-24


@torch.no_grad()
def fp8_fake_quant(x: torch.Tensor, amax: torch.Tensor | float | None = None) -> torch.Tensor:
    """Quantize ``x`` to E4M3 and dequantize it again, with one scale (``amax`` a scalar, by default
    ``max|x|``) or one per slice (``amax`` broadcast against ``x``, e.g. ``[..., 1]`` per row).

    With ``k = 448 / amax`` (an amax <= 2^-24 is replaced by 1, so an all-zero row stays zero)::

        q = e4m3(clamp(x·k, -448, 448)) · (1 / k)

    computed in FP32 and cast back to ``x.dtype``. Multiplying by ``k`` and by its FP32 reciprocal
    (rather than dividing by ``amax / 448``) is the operation order of modelopt's CPU FP8 path
    (``modelopt.torch.quantization.tensor_quant.scaled_e4m3``, which runs ``_fp8_eager`` off-GPU);
    the tests check bit equality against it.
    """
    if not x.is_floating_point():
        raise TypeError(f"FP8 fake quantization expects a floating-point tensor, got {x.dtype}")
    if amax is None:
        amax = x.abs().amax() if x.numel() else torch.zeros((), device=x.device)
    amax = torch.as_tensor(amax, device=x.device).to(torch.float32)
    amax = torch.where(amax <= _AMAX_EPSILON, torch.ones_like(amax), amax)
    k = E4M3_MAX / amax
    q = (x.to(torch.float32) * k).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (q.to(torch.float32) * (1 / k)).to(x.dtype)
