"""Where a module lives: the device of its first parameter (or buffer), the CPU for an empty one."""

from __future__ import annotations

import torch
from torch import nn


def module_device(module: nn.Module) -> torch.device:
    """The device of `module`'s first parameter, else of its first buffer, else the CPU."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")
