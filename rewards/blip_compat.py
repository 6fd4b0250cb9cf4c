"""ImageReward's BLIP modules (image-reward 1.5's `models/BLIP/vit.py` and `med.py`) loaded under transformers 5.

The image-reward package cannot be imported as a package here: its `ImageReward/__init__.py` imports
`clip` and `datasets` (not dependencies of this project; the package is installed without its
dependencies) and its `init_tokenizer` fetches `bert-base-uncased` from the hub. Only the two files
that define the networks are loaded, from the installed distribution, by path, under private module
names (`load_blip_modules`). Nothing in site-packages is modified.

`vit.py` (BLIP's VisionTransformer) imports timm's deprecated module paths and fairscale; both still
work with timm 1.0 and fairscale 0.4 (timm warns, the warning is silenced here).

`med.py` (BLIP's BERT with cross-attention) was written against transformers 4.x. Under transformers 5,
three things break, and this module supplies the least that makes it run unchanged:

1. Its import `from transformers.modeling_utils import apply_chunking_to_forward,
   find_pruneable_heads_and_indices, prune_linear_layer` fails: the first and last now live only in
   `transformers.pytorch_utils`, the middle one was removed. While med.py executes (and only then),
   `sys.modules["transformers.modeling_utils"]` is a stand-in module holding everything of the real one
   plus these three names, the first two taken from `transformers.pytorch_utils`;
   `find_pruneable_heads_and_indices` serves only attention-head pruning, which scoring never does, so
   it raises NotImplementedError. The real module is put back at once and is never changed.
2. `PreTrainedModel` lost `invert_attention_mask` and `get_head_mask`, which `BertModel.forward` calls.
   `BertModel` below (a subclass of med.py's) defines them: the encoder mask (1 = attend) becomes an
   additive mask (0 where attended, the dtype's minimum elsewhere), as transformers 4 did; `head_mask`
   must be None (one None per layer), anything else raises NotImplementedError.
3. `PreTrainedModel.init_weights` now ties weights through `self.all_tied_weights_keys`, which
   `post_init()` sets; med.py's `BertModel.__init__` predates `post_init` and calls `init_weights()`
   directly, which raises AttributeError. The subclass sets the (empty: this encoder ties nothing)
   mapping before the random initialisation, which then runs as med.py intends.

Checked to work unchanged under transformers 5: `transformers.file_utils.ModelOutput`, the
`transformers.modeling_outputs` classes, `BertConfig.from_json_file` (extra keys such as
`encoder_width` are kept, `add_cross_attention` is honoured), `config.chunk_size_feed_forward` (0: no
chunking), med.py's own `get_extended_attention_mask` (it uses `self.dtype`, still a property), `ACT2FN`,
and strict `load_state_dict` round trips (tests/rewards/test_hps_imagereward.py).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import sys
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

DISTRIBUTION = "image-reward"
VIT_FILE = "ImageReward/models/BLIP/vit.py"
MED_FILE = "ImageReward/models/BLIP/med.py"
_MODULE_PREFIX = "rewards._imagereward_blip"


def _find_pruneable_heads_and_indices(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("attention-head pruning is not supported for ImageReward's BLIP text encoder "
                              "(transformers 5 removed find_pruneable_heads_and_indices; scoring never prunes)")


@contextmanager
def _modeling_utils_with_removed_names() -> Iterator[None]:
    """`transformers.modeling_utils`, as seen by imports, gains the names med.py needs, for the duration."""
    import transformers.modeling_utils as real
    import transformers.pytorch_utils as pytorch_utils

    stand_in = types.ModuleType(real.__name__, real.__doc__)
    stand_in.__dict__.update(vars(real))
    stand_in.__dict__.setdefault("apply_chunking_to_forward", pytorch_utils.apply_chunking_to_forward)
    stand_in.__dict__.setdefault("prune_linear_layer", pytorch_utils.prune_linear_layer)
    stand_in.__dict__.setdefault("find_pruneable_heads_and_indices", _find_pruneable_heads_and_indices)
    sys.modules[real.__name__] = stand_in
    try:
        yield
    finally:
        sys.modules[real.__name__] = real


def _package_file(relative: str) -> str:
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(f"the imagereward reward needs the {DISTRIBUTION} package (1.5): "
                          f"pip install --no-deps image-reward==1.5") from None
    file = distribution.locate_file(relative)
    if not file.is_file():
        raise ImportError(f"{DISTRIBUTION} is installed but lacks {relative} (expected image-reward 1.5)")
    return str(file)


def _load_module(relative: str, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, _package_file(relative))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


@functools.cache
def load_blip_modules() -> tuple[types.ModuleType, types.ModuleType]:
    """(vit, med): image-reward's BLIP `vit.py` and `med.py`, loaded once per process (see the module docstring)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"timm\.")
        vit = _load_module(VIT_FILE, f"{_MODULE_PREFIX}.vit")
    with _modeling_utils_with_removed_names():
        med = _load_module(MED_FILE, f"{_MODULE_PREFIX}.med")
    return vit, med


@functools.cache
def bert_model_class() -> type:
    """med.py's `BertModel`, with what transformers 5 no longer provides it (points 2 and 3 above)."""
    _, med = load_blip_modules()

    class BertModel(med.BertModel):
        def init_weights(self) -> None:
            self.all_tied_weights_keys = {}
            super().init_weights()

        def invert_attention_mask(self, encoder_attention_mask: torch.Tensor) -> torch.Tensor:
            if encoder_attention_mask.dim() == 3:
                mask = encoder_attention_mask[:, None, :, :]
            elif encoder_attention_mask.dim() == 2:
                mask = encoder_attention_mask[:, None, None, :]
            else:
                raise ValueError(f"encoder_attention_mask must have rank 2 or 3, got {encoder_attention_mask.dim()}")
            mask = mask.to(dtype=self.dtype)
            return (1.0 - mask) * torch.finfo(self.dtype).min

        def get_head_mask(self, head_mask: torch.Tensor | None, num_hidden_layers: int) -> list[None]:
            if head_mask is not None:
                raise NotImplementedError("head_mask is not supported (transformers 5 removed get_head_mask)")
            return [None] * num_hidden_layers

    return BertModel
