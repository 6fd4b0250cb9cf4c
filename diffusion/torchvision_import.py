"""Import torchvision where its compiled operators cannot load (a CPU torch beside PyPI's CUDA torchvision).

open_clip (HPSv2.1), timm (ImageReward's ViT) and the official preprocessing pipelines import
torchvision, but use only its pure-Python transforms. PyPI ships torchvision for x86-64 Linux as a
CUDA build: beside a CPU build of the same torch its extension `_C` cannot load (it links
`libtorch_cuda`), and torchvision 0.28's `_meta_registrations` then fails at import with
"operator torchvision::nms does not exist", because it registers fake kernels for `nms` and `qnms`
without checking that the extension defined them (the other operators are guarded by
`extension._has_ops()`).

`import_torchvision()` is the one place that handles this: it imports torchvision and, only when
that exact failure occurs, declares the two operator schemas (no kernels: calling `nms` then raises)
and imports again. On a machine whose torchvision extension loads (any CUDA cluster) it is a plain
import. `diffusion/__init__.py` calls it, so it runs in every process before transformers (whose
CLIP and SigLIP classes import torchvision when it is installed), diffusers, open_clip or timm.
"""

from __future__ import annotations

import sys
from types import ModuleType

import torch

# The schemas torchvision's C++ extension declares (torchvision/csrc/ops/nms.cpp and
# torchvision/csrc/ops/quantized/cpu/qnms_kernel.cpp).
_UNGUARDED_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_MISSING_OPERATOR = "operator torchvision::nms does not exist"
_library: torch.library.Library | None = None  # kept alive: dropping it would undefine the schemas


def _forget_partial_import() -> None:
    for name in [name for name in sys.modules if name == "torchvision" or name.startswith("torchvision.")]:
        del sys.modules[name]


def import_torchvision() -> ModuleType:
    """torchvision, importable even when its compiled operators are missing (see the module docstring)."""
    global _library
    try:
        import torchvision
    except RuntimeError as error:
        if _MISSING_OPERATOR not in str(error) or _library is not None:
            raise
        _forget_partial_import()
        _library = torch.library.Library("torchvision", "FRAGMENT")
        for schema in _UNGUARDED_SCHEMAS:
            _library.define(schema)
        import torchvision
    return torchvision


def torchvision_ops_available() -> bool:
    """Whether torchvision's compiled operators (nms, roi_align, image decoding kernels) loaded."""
    return bool(import_torchvision().extension._has_ops())
