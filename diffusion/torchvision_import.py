"""torchvision beside a CPU build of torch: its compiled operators cannot load, its Python still can.

open_clip (HPSv2.1), timm (ImageReward's ViT), transformers' CLIP classes and the official
preprocessing pipelines import torchvision, and use only its pure-Python transforms. PyPI ships
torchvision for x86-64 Linux as a CUDA build: beside a CPU build of the same torch its extension
`_C` cannot load (it links `libtorch_cuda`), and torchvision 0.28's `_meta_registrations` then fails
at import with "operator torchvision::nms does not exist", because it registers fake kernels for
`nms` and `qnms` without checking that the extension defined them (the other operators are guarded
by `extension._has_ops()`). Worse, transformers 5 imports torchvision when it is installed, so its
CLIP classes — and diffusers' SD3 pipeline with them — would fail too.

`prepare_torchvision()` is the one place that handles this, cheaply and before anyone imports
torchvision: it tries to load the extension the way torchvision would; only when that fails does it
declare the two operator schemas (no kernels: calling `nms` then raises), after which torchvision
imports. Where the extension loads (any CUDA machine), it defines nothing. `diffusion/__init__.py`
calls it, so it runs in every process of this project before transformers, diffusers, open_clip or
timm. It does not import torchvision itself (that costs about a second per process).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import torch

# The schemas torchvision's C++ extension declares (torchvision/csrc/ops/nms.cpp and
# torchvision/csrc/ops/quantized/cpu/qnms_kernel.cpp) that its Python registers fakes for unguarded.
UNGUARDED_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_library: torch.library.Library | None = None  # kept alive: dropping it would undefine the schemas
_prepared: bool | None = None  # None: not yet; else whether torchvision's compiled operators loaded


def _extension_path() -> Path | None:
    """torchvision's `_C` library, found without importing torchvision (None: torchvision absent)."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (folder / f"_C{suffix}").is_file():
            return folder / f"_C{suffix}"
    return None


def prepare_torchvision() -> bool:
    """Make torchvision importable; whether its compiled operators (nms, roi_align, …) are available."""
    global _library, _prepared
    if _prepared is not None:
        return _prepared
    path = _extension_path()
    if path is None:
        _prepared = False
        return False
    try:
        torch.ops.load_library(str(path))  # what torchvision.extension does; loading twice is harmless
        _prepared = True
    except OSError:
        _library = torch.library.Library("torchvision", "FRAGMENT")
        for schema in UNGUARDED_SCHEMAS:
            _library.define(schema)
        _prepared = False
    return _prepared
