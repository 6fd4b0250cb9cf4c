"""hpsv2 (Human Preference Score v2.1): how much people would prefer the image for the prompt.

reward = cos(image embedding, text embedding) under the HPSv2.1 fine-tune of open_clip ViT-H/14

The official score is `score` in tgxs002/HPSv2 `hpsv2/img_score.py`: `create_model_and_transforms(
'ViT-H-14', ..., light_augmentation=True, output_dict=True)`, `model.load_state_dict(checkpoint['state_dict'])`,
`preprocess_val` on the image, `get_tokenizer('ViT-H-14')` on the prompt, then
`diagonal(image_features @ text_features.T)` of the L2-normalised features, *without* `logit_scale`.
yifan123/flow_grpo `flow_grpo/hpsv2_scorer.py::HPSv2RewardInferencer.reward` and NVlabs/Sana
`diffusion/post_training/rewards.py::HPSv2Scorer.__call__` (Sol-RL) compute the same formula.

Preprocessing is HPSv2's `preprocess_val` (its fork of open_clip, `hpsv2/src/open_clip/transform.py::
image_transform(..., resize_longest_max=True)`, i.e. `ResizeMaxSize`; open_clip 3.3 spells it
`image_transform(..., resize_mode='longest')`): the longer side is resized to 224 with bicubic
resampling, the shorter one to round(side · 224 / longer), the result is padded with black to
224 × 224 (pad // 2 before, the rest after), no crop, then normalised with OpenAI CLIP's mean / std.
Like Sol-RL's `HPSv2Scorer` (`_ResizeMaxSize` applied to the float tensors) it is done here on the
float [0, 1] tensors, on the model's device, with antialiased bicubic interpolation, then clamped to
[0, 1] as 8-bit resampling clips (Sol-RL does not clamp: its bicubic overshoot reaches ≈ 8 grey levels
at sharp edges). The official code resamples 8-bit PIL images; against open_clip's own PIL transform
on a 427 × 640 photograph the pixels differ by at most 1.3 grey levels, 0.18 on average
(tests/rewards/test_hps_imagereward.py). Unlike `ResizeMaxSize`, an image whose longer side already
is 224 but that is not square is still padded to 224 × 224.

The tokenizer is open_clip's `SimpleTokenizer` (what `get_tokenizer('ViT-H-14')` returns), whose BPE
vocabulary ships inside the open_clip wheel: nothing is downloaded. Prompts are cut to 77 tokens.

Folder layout (`path`):

    path/HPS_v2.1_compressed.pt    from huggingface.co/xswu/HPSv2 (tgxs002/HPSv2), a pickle of
                                   {'state_dict': ...} read with torch.load(weights_only=True)
    or path/HPS_v2.1_compressed.safetensors, its twin written by `python -m rewards.convert`
                                   (preferred when present; the .pt may then be deleted)

The architecture (open_clip's built-in `ViT-H-14` config) ships with open_clip, so the checkpoint
is the only file. `details` is empty: the score already is the cosine.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rewards.base import Metadata, Reward, WeightFile, register_reward, require_files
from rewards.model_placement import resolve_device, resolve_dtype
from rewards.state_dicts import checkpoint_on_disk, load_state_dict

CHECKPOINT = "HPS_v2.1_compressed.pt"
SOURCE = "huggingface.co/xswu/HPSv2 (HPSv2.1 of tgxs002/HPSv2)"
DEFAULT_MODEL_CONFIG = "ViT-H-14"


def checkpoint_file(path: str | Path | None) -> Path:
    """The checkpoint in `path`: HPS_v2.1_compressed.pt or its safetensors twin (`checkpoint_on_disk`)."""
    if path is None:
        raise ValueError(f"hpsv2 needs option `path`: the folder with {CHECKPOINT}")
    return checkpoint_on_disk(Path(path) / CHECKPOINT)


def open_clip_config(model_config: str | Mapping[str, Any]) -> dict[str, Any]:
    """The open_clip model config: a built-in config's name (e.g. "ViT-H-14") or the config itself."""
    import open_clip

    if isinstance(model_config, str):
        config = open_clip.get_model_config(model_config)
        if config is None:
            raise ValueError(f"model_config {model_config!r} is not one of open_clip's built-in configs "
                             f"(e.g. {DEFAULT_MODEL_CONFIG!r}); pass the name or a config dict")
    elif isinstance(model_config, Mapping):
        config = copy.deepcopy(dict(model_config))
    else:
        raise ValueError(f"model_config must be an open_clip config name or dict, got {type(model_config).__name__}")
    missing = [key for key in ("embed_dim", "vision_cfg", "text_cfg") if key not in config]
    if missing:
        raise ValueError(f"model_config lacks {missing}: an open_clip config has embed_dim, vision_cfg, text_cfg")
    text_cfg, vision_cfg = config["text_cfg"], config["vision_cfg"]
    if config.get("custom_text") or "hf_model_name" in text_cfg or "hf_tokenizer_name" in text_cfg:
        raise ValueError("model_config must use open_clip's own text tower and tokenizer (as ViT-H-14 does)")
    if "timm_model_name" in vision_cfg:
        raise ValueError("model_config must use open_clip's own vision transformer (as ViT-H-14 does)")
    return config


def image_size_of(config: Mapping[str, Any]) -> int:
    size = config["vision_cfg"].get("image_size", 224)
    if isinstance(size, Sequence):
        if len(size) != 2 or size[0] != size[1]:
            raise ValueError(f"hpsv2 needs a square image_size, got {size}")
        size = size[0]
    return int(size)


def build_model(config: Mapping[str, Any]) -> torch.nn.Module:
    """open_clip's CLIP for `config`, randomly initialised (as `create_model(name, pretrained=None)`)."""
    from open_clip.model import CLIP

    return CLIP(**copy.deepcopy(dict(config)), output_dict=True)


def build_tokenizer(config: Mapping[str, Any]) -> Any:
    """open_clip's SimpleTokenizer with the config's context length (77 for ViT-H-14), vocabulary from the wheel."""
    from open_clip.tokenizer import SimpleTokenizer

    return SimpleTokenizer(context_length=int(config["text_cfg"].get("context_length", 77)))


def resize_longest_and_pad(images: torch.Tensor, size: int) -> torch.Tensor:
    """[B, C, H, W] in [0, 1] → [B, C, size, size]: longer side to `size` (antialiased bicubic, clamped to
    [0, 1]), shorter side to round(side · size / longer), zero-padded (pad // 2 before) as HPSv2's `ResizeMaxSize`."""
    height, width = images.shape[-2:]
    scale = size / max(height, width)
    new_h, new_w = round(height * scale), round(width * scale)
    if (new_h, new_w) != (height, width):
        images = F.interpolate(images, size=(new_h, new_w), mode="bicubic", align_corners=False, antialias=True)
        images = images.clamp(0.0, 1.0)  # bicubic overshoots at edges; 8-bit resampling clips there
    pad_h, pad_w = size - new_h, size - new_w
    if pad_h or pad_w:
        images = F.pad(images, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), value=0.0)
    return images


@register_reward("hpsv2")
class HPSv2(Reward):
    """HPSv2.1: cosine of the image and prompt embeddings of the HPSv2.1 fine-tune of CLIP ViT-H/14."""

    reads_uint8 = False  # resized as float tensors, as Sol-RL's HPSv2Scorer

    def __init__(
        self,
        path: str | Path,
        device: str | None = None,
        batch_size: int = 32,
        dtype: str = "float32",
        model_config: str | Mapping[str, Any] = DEFAULT_MODEL_CONFIG,
    ) -> None:
        """`path`: the folder with HPS_v2.1_compressed.pt (or its .safetensors twin).
        `device`: None → "cuda" if available, else "cpu". `batch_size`: images (and prompts) per forward.
        `dtype`: the model's dtype, "float32" (Sol-RL), "float16" or "bfloat16" (the official script runs
        fp16 autocast). `model_config`: open_clip's config name (the official "ViT-H-14") or a config dict."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        self.batch_size = batch_size
        self.config = open_clip_config(model_config)
        self.image_size = image_size_of(self.config)
        require_files(self.name, self.required_files(path=path))

        from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

        model = build_model(self.config)
        file = checkpoint_file(path)
        try:
            model.load_state_dict(load_state_dict(file), strict=True)
        except RuntimeError as error:
            raise ValueError(f"{file} does not fit open_clip model_config {model_config!r}: {error}") from error
        self.model = model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        self.tokenizer = build_tokenizer(self.config)
        self.mean = torch.tensor(OPENAI_DATASET_MEAN, device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor(OPENAI_DATASET_STD, device=self.device).view(1, 3, 1, 1)

    @classmethod
    def required_files(cls, **options: Any) -> list[WeightFile]:
        return [WeightFile(checkpoint_file(options.get("path")), SOURCE)]

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """Images [B, C, H, W] in [0, 1] → normalised float32 [B, 3, 224, 224] on the model's device."""
        images = images.to(device=self.device, dtype=torch.float32).clamp(0.0, 1.0)
        if images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1)
        return (resize_longest_and_pad(images, self.image_size) - self.mean) / self.std

    def _compute(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        scores = []
        with torch.inference_mode():
            for start in range(0, len(prompts), self.batch_size):
                chunk = slice(start, start + self.batch_size)
                pixels = self.preprocess(images[chunk]).to(self.dtype)
                tokens = self.tokenizer(list(prompts[chunk])).to(self.device)
                image_features = self.model.encode_image(pixels, normalize=True).float()
                text_features = self.model.encode_text(tokens, normalize=True).float()
                scores.append((image_features * text_features).sum(dim=-1).cpu())
        return (torch.cat(scores) if scores else torch.zeros(0)), {}
