"""CLIP embeddings for the CLIP-based rewards (pickscore, clipscore, aesthetic).

Three things the rewards share, and nothing else:

* `ClipImageTransform`: the image preprocessing, on tensors. Images [B, C, H, W] in [0, 1] become
  CLIP pixel values [B, 3, h, w] without leaving the tensor world (no PIL, no CPU round trip), so
  it runs on the GPU and gradients flow through it (rounding is straight-through). Two conventions
  exist in the official code and both are reproduced: `like_processor` (transformers'
  CLIPImageProcessor on uint8 images: bicubic, resampled as 8-bit images are, crop offset floored)
  and `like_torchvision` (flow_grpo / Sana's torchvision transform of the float tensor: bilinear,
  one pass, crop offset rounded).
* The files and the loading of a CLIP checkpoint in the Hugging Face layout (`clip_model_files`,
  `clip_processor_files`, `load_clip_model`, `load_clip_tokenizer`, `load_image_processor`), with
  the real transformers classes. A pickled `pytorch_model.bin` is read only through
  `rewards.state_dicts.load_state_dict` (weights_only, or its safetensors twin).
* `ClipEmbedder`: model + tokenizer + transform + device/dtype/batching, giving L2-normalised image
  and text embeddings (float32) and the model's `logit_scale.exp()`.

Official folder layout of a CLIP checkpoint on the Hugging Face hub (e.g. openai/clip-vit-large-patch14):
`config.json`, `model.safetensors` (older releases: `pytorch_model.bin`), `preprocessor_config.json`,
`vocab.json`, `merges.txt`, `tokenizer_config.json` (and `tokenizer.json`, `special_tokens_map.json`,
read when present).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rewards.base import WeightFile
from rewards.model_placement import resolve_device, resolve_dtype
from rewards.state_dicts import converted_path, load_state_dict

SAFETENSORS_WEIGHTS = "model.safetensors"
PICKLED_WEIGHTS = "pytorch_model.bin"
MODEL_FILES = ("config.json",)
IMAGE_PROCESSOR_FILE = "preprocessor_config.json"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
# transformers' `resample` values (PIL's codes) → torch.nn.functional.interpolate modes.
_RESAMPLE_MODES = {2: "bilinear", 3: "bicubic"}


# --------------------------------------------------------------------------- preprocessing


def round_to_uint8_grid(images: torch.Tensor) -> torch.Tensor:
    """round(x · 255) / 255 in the forward pass (exactly), identity for the gradient (straight-through)."""
    return ((images * 255.0).round() / 255.0).detach() + (images - images.detach())


@dataclass(frozen=True)
class ClipImageTransform:
    """Images [B, C, H, W] in [0, 1] (C = 1 or 3) → CLIP pixel values [B, 3, h, w], float32.

    Steps: grey → RGB by repeating the channel; resize (the shortest edge to `resize`, the other
    edge to int(resize · long / short), as transformers and torchvision both compute it; or to
    exactly (h, w) when `resize` is a pair; skipped when the size already matches) with an
    antialiased filter (`F.interpolate(..., antialias=True)`: PIL's and torchvision's kernels);
    centre crop to `crop`; (x − mean) / std per channel. Every step is a tensor op; rounding uses a
    straight-through gradient, so gradients reach the input.

    `uint8_resample` reproduces how PIL (and torch's uint8 kernels, a port of PIL's) resample an
    8-bit image: one axis at a time, width first, each pass saturating to [0, 1] — the saturation of
    the intermediate image clips the bicubic filter's overshoot at strong edges, which a one-pass
    float resize keeps (up to 3/255 apart on a photograph). `quantize` adds the rounding to the
    1/255 grid where that pipeline holds uint8 values: the input and each pass's output.
    """

    resize: int | tuple[int, int] | None
    crop: tuple[int, int] | None
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str  # "bicubic" or "bilinear"
    crop_rounding: str  # "floor" (transformers: (H − h) // 2) or "round" (torchvision: round((H − h) / 2))
    uint8_resample: bool = False
    quantize: bool = False

    def __post_init__(self) -> None:
        if self.interpolation not in ("bicubic", "bilinear"):
            raise ValueError(f"interpolation must be 'bicubic' or 'bilinear', got {self.interpolation!r}")
        if self.crop_rounding not in ("floor", "round"):
            raise ValueError(f"crop_rounding must be 'floor' or 'round', got {self.crop_rounding!r}")
        if self.quantize and not self.uint8_resample:
            raise ValueError("quantize emulates the uint8 pipeline: it needs uint8_resample")

    @classmethod
    def like_processor(cls, config: dict[str, Any], quantize: bool = True) -> ClipImageTransform:
        """The convention of transformers' `CLIPImageProcessor` (PIL and torchvision backends) on uint8 images.

        `config` is the image processor's `to_dict()`: its `resample` filter (bicubic in every
        official CLIP release) applied as to a uint8 image (`uint8_resample`, and with `quantize`
        the uint8 rounding of the input and of each pass), crop offset (H − h) // 2, then rescale
        (1/255: the [0, 1] floats are uint8 / 255 already) and normalise with `image_mean` / `image_std`.
        """
        if not config.get("do_rescale", True):
            raise ValueError("unsupported image processor with do_rescale false (it feeds 0..255 values to the model)")
        if abs(float(config.get("rescale_factor", 1 / 255)) - 1 / 255) > 1e-9:
            raise ValueError(f"unsupported rescale_factor {config.get('rescale_factor')}: only 1/255 maps uint8 "
                             "images onto the [0, 1] floats rewards receive")
        resample = int(config.get("resample", 3))
        if resample not in _RESAMPLE_MODES:
            raise ValueError(f"unsupported resample {resample}; supported: {sorted(_RESAMPLE_MODES)} "
                             "(PIL's BILINEAR and BICUBIC codes)")
        return cls._from_config(config, interpolation=_RESAMPLE_MODES[resample], crop_rounding="floor",
                                uint8_resample=True, quantize=quantize)

    @classmethod
    def like_torchvision(cls, config: dict[str, Any]) -> ClipImageTransform:
        """The convention of flow_grpo's `clip_scorer.py::get_image_transform` (also NVlabs/Sana
        `diffusion/post_training/rewards.py::_get_clip_image_transform`): torchvision
        `T.Resize(size)` (bilinear, antialiased: torchvision's defaults, whatever `resample` says),
        `T.CenterCrop(crop_size)` (offset round((H − h) / 2)), `T.Normalize(image_mean, image_std)`,
        all on the float tensor: one-pass resize, no rescale, no clamp, no rounding.
        `config`: the image processor's `to_dict()`.
        """
        return cls._from_config(config, interpolation="bilinear", crop_rounding="round")

    @classmethod
    def _from_config(cls, config: dict[str, Any], **convention: Any) -> ClipImageTransform:
        resize = _size_of(config.get("size"), "size") if config.get("do_resize", True) else None
        crop = _size_of(config.get("crop_size"), "crop_size") if config.get("do_center_crop", True) else None
        if isinstance(crop, int):
            crop = (crop, crop)
        if config.get("do_normalize", True):
            mean, std = tuple(config["image_mean"]), tuple(config["image_std"])
        else:
            mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        if len(mean) != 3 or len(std) != 3:
            raise ValueError(f"image_mean and image_std must have 3 entries, got {mean} and {std}")
        return cls(resize=resize, crop=crop, mean=mean, std=std, **convention)

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """(h, w) after the resize step."""
        if self.resize is None:
            return height, width
        if isinstance(self.resize, tuple):
            return self.resize
        if height <= width:
            return self.resize, int(self.resize * width / height)
        return int(self.resize * height / width), self.resize

    def crop_box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """(top, left, h, w) of the centre crop of an image of this (resized) size."""
        if self.crop is None:
            return 0, 0, height, width
        crop_h, crop_w = self.crop
        if crop_h > height or crop_w > width:
            raise ValueError(f"centre crop {self.crop} is larger than the resized image ({height}, {width})")
        if self.crop_rounding == "floor":
            return (height - crop_h) // 2, (width - crop_w) // 2, crop_h, crop_w
        # Python rounds halves to even, as torchvision does (55.5 → 56, 54.5 → 54).
        return round((height - crop_h) / 2.0), round((width - crop_w) / 2.0), crop_h, crop_w

    def _resample(self, images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        return F.interpolate(images, size=size, mode=self.interpolation, align_corners=False, antialias=True)

    def resized(self, images: torch.Tensor) -> torch.Tensor:
        """Images [B, 3, H, W] in [0, 1] after the resize step (before the crop), float32."""
        height, width = images.shape[-2:]
        size = self.resized_size(height, width)
        if self.quantize:
            images = round_to_uint8_grid(images)
        if size == (height, width):
            return images
        if not self.uint8_resample:
            return self._resample(images, size)
        for pass_size in ((height, size[1]), size):  # width first, then height, as PIL
            if pass_size != tuple(images.shape[-2:]):
                images = self._resample(images, pass_size).clamp(0.0, 1.0)
                if self.quantize:
                    images = round_to_uint8_grid(images)
        return images

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        images = images.float().clamp(0.0, 1.0)
        if images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1)
        images = self.resized(images)
        top, left, crop_h, crop_w = self.crop_box(*images.shape[-2:])
        images = images[..., top : top + crop_h, left : left + crop_w]
        mean = torch.tensor(self.mean, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
        return (images - mean) / std


def _size_of(size: object, key: str) -> int | tuple[int, int]:
    """An image processor's `size` / `crop_size` entry: an int (shortest edge) or (height, width)."""
    if isinstance(size, int):
        return size
    if isinstance(size, dict):
        if size.get("height") is not None and size.get("width") is not None:
            return int(size["height"]), int(size["width"])
        if size.get("shortest_edge") is not None and size.get("longest_edge") is None:
            return int(size["shortest_edge"])
    raise ValueError(f"unsupported {key} {size!r} in the image processor config: expected an int, "
                     "{'shortest_edge': N} or {'height': H, 'width': W}")


# --------------------------------------------------------------------------- files and loading


def clip_weights(folder: str | Path) -> Path:
    """The weights file of a CLIP folder: `model.safetensors`, else `pytorch_model.bin` when only that
    (or its safetensors twin `pytorch_model.safetensors`) is there."""
    folder = Path(folder)
    pickled = folder / PICKLED_WEIGHTS
    if not (folder / SAFETENSORS_WEIGHTS).is_file() and (pickled.is_file() or converted_path(pickled).is_file()):
        return converted_path(pickled) if converted_path(pickled).is_file() else pickled
    return folder / SAFETENSORS_WEIGHTS


def clip_model_files(folder: str | Path, source: str) -> list[WeightFile]:
    """config.json and the weights file of the CLIP model in `folder` (from the release `source`)."""
    folder = Path(folder)
    return [*(WeightFile(folder / name, source) for name in MODEL_FILES), WeightFile(clip_weights(folder), source)]


def clip_processor_files(folder: str | Path, source: str, tokenizer: bool = True) -> list[WeightFile]:
    """preprocessor_config.json and (with `tokenizer`) vocab.json, merges.txt, tokenizer_config.json."""
    folder = Path(folder)
    names = (IMAGE_PROCESSOR_FILE, *(TOKENIZER_FILES if tokenizer else ()))
    return [WeightFile(folder / name, source) for name in names]


def load_clip_model(folder: str | Path, dtype: torch.dtype = torch.float32) -> Any:
    """transformers `CLIPModel` from a Hugging Face CLIP folder, in eval mode, on the CPU.

    `model.safetensors` is loaded by `from_pretrained` itself; a pickled `pytorch_model.bin` is read
    with `rewards.state_dicts.load_state_dict` and handed over as a state dict. Any weight the model
    expects but the file lacks (or has with another shape) is an error, not a silent random init.
    """
    from transformers import CLIPConfig, CLIPModel

    folder = Path(folder)
    weights = clip_weights(folder)
    if weights.name == SAFETENSORS_WEIGHTS:
        model, info = CLIPModel.from_pretrained(folder, dtype=dtype, use_safetensors=True, output_loading_info=True)
    else:
        config = CLIPConfig.from_pretrained(folder)
        model, info = CLIPModel.from_pretrained(
            None, config=config, state_dict=load_state_dict(weights), dtype=dtype, output_loading_info=True
        )
    problems = {key: sorted(info.get(key) or ()) for key in ("missing_keys", "mismatched_keys")}
    if any(problems.values()):
        raise ValueError(f"{weights} does not fit the CLIP model of {folder / 'config.json'}: {problems}")
    return model.eval().requires_grad_(False)


def load_clip_tokenizer(folder: str | Path, vocab_size: int) -> Any:
    """transformers `CLIPTokenizer` from `folder`; ValueError unless its vocabulary has `vocab_size`
    tokens (the text model's), which catches a wrong or placeholder tokenizer before it scores."""
    from transformers import CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(folder)
    if len(tokenizer) != vocab_size:
        raise ValueError(f"the tokenizer in {folder} has {len(tokenizer)} tokens but the text model expects "
                         f"{vocab_size}: it is not this model's tokenizer (vocab.json / merges.txt)")
    return tokenizer


def load_image_processor(folder: str | Path) -> dict[str, Any]:
    """The settings of the `CLIPImageProcessor` in `folder` (its `to_dict()`), read by transformers."""
    from transformers import CLIPImageProcessor  # it imports torchvision: `diffusion` made that possible

    return CLIPImageProcessor.from_pretrained(folder).to_dict()


# --------------------------------------------------------------------------- embeddings


def _pooled(features: Any) -> torch.Tensor:
    # transformers 5 returns a ModelOutput whose pooler_output is the projected embedding; 4.x a tensor.
    return features if isinstance(features, torch.Tensor) else features.pooler_output


class ClipEmbedder:
    """A CLIP model ready to embed: L2-normalised image and text embeddings, float32, on the CPU.

    `model_path`: the CLIP folder (config.json + weights). `processor_path`: the folder with
    preprocessor_config.json (and the tokenizer files, when `text`). `transform`: "processor"
    (`ClipImageTransform.like_processor`) or "torchvision" (`ClipImageTransform.like_torchvision`).
    `device`: None → "cuda" if available else "cpu". `dtype`: the model's dtype (embeddings are
    normalised in float32). `batch_size`: images (and prompts) per forward pass.
    """

    def __init__(
        self,
        model_path: str | Path,
        processor_path: str | Path,
        transform: str,
        text: bool = True,
        device: str | torch.device | None = None,
        dtype: str = "float32",
        batch_size: int = 32,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if transform not in ("processor", "torchvision"):
            raise ValueError(f"transform must be 'processor' or 'torchvision', got {transform!r}")
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        self.batch_size = batch_size
        settings = load_image_processor(processor_path)
        self.transform = (ClipImageTransform.like_processor(settings) if transform == "processor"
                          else ClipImageTransform.like_torchvision(settings))
        self.model = load_clip_model(model_path, self.dtype).to(self.device)
        text_config = self.model.config.text_config
        self.tokenizer = load_clip_tokenizer(processor_path, text_config.vocab_size) if text else None
        self.max_tokens = text_config.max_position_embeddings  # 77 in every CLIP release

    @property
    def logit_scale(self) -> torch.Tensor:
        """exp(logit_scale) of the model, float32 scalar on the CPU."""
        return self.model.logit_scale.detach().float().exp().cpu()

    def pixel_values(self, images: torch.Tensor) -> torch.Tensor:
        """The preprocessed images [B, 3, h, w] in the model's dtype, on its device."""
        return self.transform(images.to(self.device)).to(self.dtype)

    def image_embeddings(self, images: torch.Tensor) -> torch.Tensor:
        """L2-normalised image embeddings [B, D] (float32, CPU) of images [B, C, H, W] in [0, 1]."""
        if images.shape[0] == 0:
            return torch.zeros(0, self.model.config.projection_dim)
        chunks = []
        with torch.inference_mode():
            for chunk in images.split(self.batch_size):
                features = _pooled(self.model.get_image_features(pixel_values=self.pixel_values(chunk)))
                chunks.append(F.normalize(features.float(), dim=-1).cpu())
        return torch.cat(chunks)

    def text_embeddings(self, prompts: Sequence[str]) -> torch.Tensor:
        """L2-normalised text embeddings [B, D] (float32, CPU); each distinct prompt is encoded once.

        Tokens: CLIP BPE, truncated and padded to 77 (`max_position_embeddings`); the causal text
        encoder pools the end-of-text token, so padding to 77 or to the longest prompt is the same.
        """
        if self.tokenizer is None:
            raise RuntimeError("this ClipEmbedder was built with text=False")
        unique = list(dict.fromkeys(prompts))
        chunks = []
        with torch.inference_mode():
            for start in range(0, len(unique), self.batch_size):
                tokens = self.tokenizer(unique[start : start + self.batch_size], padding="max_length",
                                        truncation=True, max_length=self.max_tokens, return_tensors="pt")
                features = _pooled(self.model.get_text_features(
                    input_ids=tokens["input_ids"].to(self.device),
                    attention_mask=tokens["attention_mask"].to(self.device),
                ))
                chunks.append(F.normalize(features.float(), dim=-1).cpu())
        if not chunks:
            return torch.zeros(0, self.model.config.projection_dim)
        embeddings = torch.cat(chunks)
        index = {prompt: i for i, prompt in enumerate(unique)}
        return embeddings[torch.tensor([index[prompt] for prompt in prompts], dtype=torch.long)]
