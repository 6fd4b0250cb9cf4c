"""An exponential moving average of θ's trainable parameters, for evaluation.

After optimizer step number s (1 for the first, counted after the increment as the official loop
does): e ← e + (1 − d_s)·(θ − e), d_s = min((1 + s)/(10 + s), decay) — a warm-up that trusts early
steps, then a fixed decay (0.9 in the papers' configs). (NVlabs/DiffusionNFT `flow_grpo/ema.py`
`EMAModuleWrapper.step`, called after `global_step += 1` in `train_scripts/sol_rl/train_sd3.py`.)
Evaluation swaps e into θ's parameters and back (`applied`), as the official `copy_ema_to` /
`copy_temp_to` pair does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch


def ema_decay(step: int, cap: float) -> float:
    """d_s = min((1 + s)/(10 + s), cap)."""
    return min((1 + step) / (10 + step), cap)


class ParameterEMA:
    """The average `e` of named parameters; holds its own float copies (never aliases θ)."""

    def __init__(self, parameters: Mapping[str, torch.Tensor], decay: float) -> None:
        self.decay = decay
        self.average = {name: p.detach().clone() for name, p in parameters.items()}

    @torch.no_grad()
    def update(self, parameters: Mapping[str, torch.Tensor], step: int) -> None:
        """e ← e + (1 − d_s)·(θ − e) for optimizer step `step`."""
        weight = 1.0 - ema_decay(step, self.decay)
        for name, average in self.average.items():
            average.add_(parameters[name].detach() - average, alpha=weight)

    @contextlib.contextmanager
    def applied(self, parameters: Mapping[str, torch.Tensor]) -> Iterator[None]:
        """Inside, `parameters` hold e; on exit their own values return, bit for bit."""
        with torch.no_grad():
            saved = {name: p.detach().clone() for name, p in parameters.items()}
            for name, p in parameters.items():
                p.copy_(self.average[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, p in parameters.items():
                    p.copy_(saved[name])
