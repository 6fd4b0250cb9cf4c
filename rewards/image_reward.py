"""imagereward (ImageReward v1.0, THUDM): how much people would prefer the image for the prompt.

reward = (MLP(BLIP text encoder's [CLS] state, cross-attending to the image) − 0.16717362830052426)
         / 1.0333394966054072

The official score is `ImageReward.score` (and `inference_rank`) in THUDM/ImageReward
`ImageReward/ImageReward.py`, loaded by `ImageReward/utils.py::load`: BLIP's ViT-L/16 at 224
(`models/BLIP/blip.py::create_vit('large', 224)`) encodes the image; BLIP's BERT with cross-attention
(`models/BLIP/med.py::BertModel`, `add_pooling_layer=False`, configured by `med_config.json` with
`encoder_width` = 1024) reads the prompt, tokenised by `bert-base-uncased` plus the `[DEC]` bos and
`[ENC]` tokens (`blip.py::init_tokenizer`) with padding='max_length', truncation, max_length=35, and
cross-attends to every image token; the `[CLS]` hidden state goes through `ImageReward.py::MLP`
(five linear layers, no activation, dropout off in eval) and is standardised with the mean / std above.

The networks are image-reward's own `vit.py` and `med.py` (loaded by `rewards.blip_compat`, which
explains what transformers 5 needs); the MLP head and the glue are written here. Each image is scored
against its own prompt once: B forward passes for B images. (The Sol-RL and DiffusionNFT wrappers,
NVlabs/Sana `diffusion/post_training/rewards.py::ImageRewardScorer` and NVlabs/DiffusionNFT
`flow_grpo/imagereward_scorer.py`, call `inference_rank(prompts, images)`, which scores every image
against every prompt, B², and keep the diagonal; the diagonal is this.)

Preprocessing is the official `ImageReward.py::_transform(224)` on a PIL image: Resize(224, bicubic)
of the shorter side, CenterCrop(224), RGB, ToTensor, Normalize with OpenAI CLIP's mean / std. The
float images are first rounded to 8 bits (round(x · 255)) and made PIL images, as the Sol-RL wrapper
(`imagereward_score`) does, so the preprocessing is the official one exactly.

Folder layout (`path`, and `tokenizer_path`, default `path/bert-base-uncased`):

    path/ImageReward.pt          from huggingface.co/THUDM/ImageReward: a pickled bare state dict, read
                                 with torch.load(weights_only=True), or its ImageReward.safetensors twin
                                 (`python -m rewards.convert`), preferred when present
    path/med_config.json         from huggingface.co/THUDM/ImageReward
    tokenizer_path/vocab.txt     from huggingface.co/google-bert/bert-base-uncased (its
                                 tokenizer_config.json and tokenizer.json are read too when present)

`details` reports per sample `raw`, the MLP's output before standardisation.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rewards.base import Metadata, Reward, WeightFile, register_reward, require_files
from rewards.blip_compat import bert_model_class, load_blip_modules
from rewards.jpeg_compressibility import to_pil
from rewards.model_placement import resolve_device, resolve_dtype
from rewards.state_dicts import checkpoint_on_disk, load_state_dict

CHECKPOINT = "ImageReward.pt"
MED_CONFIG = "med_config.json"
TOKENIZER_SUBFOLDER = "bert-base-uncased"
VOCAB = "vocab.txt"
SOURCE = "huggingface.co/THUDM/ImageReward"
TOKENIZER_SOURCE = "huggingface.co/google-bert/bert-base-uncased"

REWARD_MEAN = 0.16717362830052426
REWARD_STD = 1.0333394966054072
MAX_TOKENS = 35
IMAGE_SIZE = 224
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# blip.py::create_vit: the two BLIP ViTs (stochastic depth only acts in training).
VIT_SIZES: dict[str, dict[str, float]] = {
    "large": {"width": 1024, "depth": 24, "heads": 16, "patch_size": 16, "drop_path_rate": 0.1},
    "base": {"width": 768, "depth": 12, "heads": 12, "patch_size": 16, "drop_path_rate": 0.0},
}
_VIT_KEYS = ("width", "depth", "heads", "patch_size")
# In ImageReward.pt but not used by the score: BLIP_Pretrain's contrastive projections.
UNUSED_PREFIXES = ("blip.vision_proj.", "blip.text_proj.")


def _folders(path: str | Path | None, tokenizer_path: str | Path | None) -> tuple[Path, Path]:
    if path is None:
        raise ValueError(f"imagereward needs option `path`: the folder with {CHECKPOINT} and {MED_CONFIG}")
    path = Path(path)
    return path, Path(tokenizer_path) if tokenizer_path is not None else path / TOKENIZER_SUBFOLDER


def vit_size(vit: str | Mapping[str, Any]) -> dict[str, Any]:
    """"large" (official) | "base" | {width, depth, heads, patch_size}: the BLIP ViT's size."""
    if isinstance(vit, str):
        if vit not in VIT_SIZES:
            raise ValueError(f"vit must be one of {', '.join(VIT_SIZES)} or a dict of {', '.join(_VIT_KEYS)}, "
                             f"got {vit!r}")
        return dict(VIT_SIZES[vit])
    if not isinstance(vit, Mapping) or set(vit) - {*_VIT_KEYS, "drop_path_rate"} or set(_VIT_KEYS) - set(vit):
        raise ValueError(f"vit must be 'large', 'base' or a dict with exactly {', '.join(_VIT_KEYS)}, got {vit!r}")
    size = {"drop_path_rate": 0.0, **vit}
    if any(not isinstance(size[key], int) or size[key] < 1 for key in _VIT_KEYS):
        raise ValueError(f"vit sizes must be positive integers, got {vit!r}")
    if size["width"] % size["heads"] or IMAGE_SIZE % size["patch_size"]:
        raise ValueError(f"vit width must divide into heads and {IMAGE_SIZE} into patches, got {vit!r}")
    return size


class ScoreHead(nn.Module):
    """ImageReward.py's `MLP`: linear layers 768 → 1024 → 128 → 64 → 16 → 1, no activations, with
    dropout (inactive in eval). Same module names, so the checkpoint's `mlp.layers.*` load into it."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(width, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features)


class ImageRewardNet(nn.Module):
    """The modules of the official `ImageReward` that the score uses, under the checkpoint's names:
    `blip.visual_encoder`, `blip.text_encoder`, `mlp`."""

    def __init__(self, med_config: str | Path, vit: Mapping[str, Any]) -> None:
        super().__init__()
        vit_module, med = load_blip_modules()
        config = med.BertConfig.from_json_file(str(med_config))
        config.encoder_width = vit["width"]  # blip_pretrain.py: encoder_config.encoder_width = vision_width
        self.blip = nn.Module()
        self.blip.visual_encoder = vit_module.VisionTransformer(
            img_size=IMAGE_SIZE, patch_size=vit["patch_size"], embed_dim=vit["width"], depth=vit["depth"],
            num_heads=vit["heads"], drop_path_rate=vit["drop_path_rate"])
        self.blip.text_encoder = bert_model_class()(config=config, add_pooling_layer=False)
        self.mlp = ScoreHead(config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.blip.text_encoder.config.vocab_size)

    def features(self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The text encoder's [CLS] state for each (image, prompt) pair, float32 [B, hidden]."""
        image_embeds = self.blip.visual_encoder(pixels)
        image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=image_embeds.device)
        output = self.blip.text_encoder(input_ids, attention_mask=attention_mask, encoder_hidden_states=image_embeds,
                                        encoder_attention_mask=image_atts, return_dict=True)
        return output.last_hidden_state[:, 0, :].float()


def load_weights(net: ImageRewardNet, file: Path) -> list[str]:
    """Load ImageReward.pt into `net`; the checkpoint keys it ignores (ValueError if any weight is missing)."""
    state = load_state_dict(file)
    expected = net.state_dict()
    usable = {key: value for key, value in state.items() if key in expected}
    try:
        result = net.load_state_dict(usable, strict=False)
    except RuntimeError as error:
        raise ValueError(f"{file} does not fit the network built from {MED_CONFIG} and the `vit` option: "
                         f"{error}") from error
    # position_ids is a constant buffer (arange) that some checkpoints leave out.
    missing = [key for key in result.missing_keys if not key.endswith("embeddings.position_ids")]
    if missing:
        shown = ", ".join(missing[:8]) + (" …" if len(missing) > 8 else "")
        raise ValueError(f"{file} lacks {len(missing)} weight(s) of ImageReward: {shown}")
    return sorted(set(state) - set(usable))


def load_tokenizer(folder: Path) -> Any:
    """bert-base-uncased from `folder` with BLIP's `[DEC]` bos and `[ENC]` tokens (blip.py::init_tokenizer)."""
    from transformers import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(str(folder), local_files_only=True)
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    tokenizer.enc_token_id = tokenizer.convert_tokens_to_ids("[ENC]")
    return tokenizer


def official_transform() -> Any:
    """ImageReward.py's `_transform(224)`, for PIL images."""
    from torchvision.transforms import CenterCrop, Compose, InterpolationMode, Normalize, Resize, ToTensor

    return Compose([
        Resize(IMAGE_SIZE, interpolation=InterpolationMode.BICUBIC),
        CenterCrop(IMAGE_SIZE),
        lambda image: image.convert("RGB"),
        ToTensor(),
        Normalize(CLIP_MEAN, CLIP_STD),
    ])


@register_reward("imagereward")
class ImageRewardScore(Reward):
    """ImageReward v1.0: BLIP image-text features → MLP → standardised preference score."""

    reads_uint8 = True  # 8-bit PIL images (`to_pil`), as the Sol-RL wrapper

    def __init__(
        self,
        path: str | Path,
        tokenizer_path: str | Path | None = None,
        device: str | None = None,
        batch_size: int = 32,
        dtype: str = "float32",
        vit: str | Mapping[str, Any] = "large",
    ) -> None:
        """`path`: the folder with ImageReward.pt (or its .safetensors twin) and med_config.json.
        `tokenizer_path`: the bert-base-uncased tokenizer folder (None → path/bert-base-uncased).
        `device`: None → "cuda" if available, else "cpu". `batch_size`: images (and prompts) per forward.
        `dtype`: the BLIP networks' dtype, "float32" (official), "float16" or "bfloat16"; the MLP head
        stays float32 (the official code casts the features to float). `vit`: the BLIP ViT, "large"
        (official, `create_vit('large', 224)`), "base", or {width, depth, heads, patch_size}."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        self.batch_size = batch_size
        size = vit_size(vit)
        folder, tokenizer_folder = _folders(path, tokenizer_path)
        require_files(self.name, self.required_files(path=path, tokenizer_path=tokenizer_path))

        self.tokenizer = load_tokenizer(tokenizer_folder)
        net = ImageRewardNet(folder / MED_CONFIG, size)
        if len(self.tokenizer) > net.vocab_size:
            raise ValueError(f"the tokenizer in {tokenizer_folder} has {len(self.tokenizer)} tokens with [DEC] and "
                             f"[ENC], more than {MED_CONFIG}'s vocab_size {net.vocab_size}")
        self.ignored_keys = load_weights(net, checkpoint_on_disk(folder / CHECKPOINT))
        unknown = [key for key in self.ignored_keys if not key.startswith(UNUSED_PREFIXES)]
        if unknown:
            warnings.warn(f"imagereward ignores {len(unknown)} unexpected checkpoint key(s), as the official "
                          f"load (strict=False) does: {', '.join(unknown[:8])}", stacklevel=2)
        net.eval().requires_grad_(False)
        net.blip.to(device=self.device, dtype=self.dtype)
        self.net = net.to(device=self.device)
        self.transform = official_transform()

    @classmethod
    def required_files(cls, **options: Any) -> list[WeightFile]:
        folder, tokenizer_folder = _folders(options.get("path"), options.get("tokenizer_path"))
        return [
            WeightFile(checkpoint_on_disk(folder / CHECKPOINT), SOURCE),
            WeightFile(folder / MED_CONFIG, SOURCE),
            WeightFile(tokenizer_folder / VOCAB, TOKENIZER_SOURCE),
        ]

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """Images [B, C, H, W] in [0, 1] → 8-bit PIL → the official transform → float32 [B, 3, 224, 224] (CPU)."""
        if images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1)
        if len(images) == 0:
            return torch.zeros(0, 3, IMAGE_SIZE, IMAGE_SIZE)
        return torch.stack([self.transform(to_pil(image)) for image in images])

    def tokenize(self, prompts: Sequence[str]) -> Any:
        """input_ids and attention_mask [B, 35], as the official code tokenises."""
        return self.tokenizer(list(prompts), padding="max_length", truncation=True, max_length=MAX_TOKENS,
                              return_tensors="pt")

    def _compute(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if len(prompts) == 0:
            return torch.zeros(0), {"raw": torch.zeros(0)}
        pixels = self.preprocess(images)
        tokens = self.tokenize(prompts)
        raw = []
        with torch.inference_mode():
            for start in range(0, len(prompts), self.batch_size):
                chunk = slice(start, start + self.batch_size)
                features = self.net.features(pixels[chunk].to(self.device, self.dtype),
                                             tokens.input_ids[chunk].to(self.device),
                                             tokens.attention_mask[chunk].to(self.device))
                raw.append(self.net.mlp(features).squeeze(-1).cpu())
        raw = torch.cat(raw)
        return (raw - REWARD_MEAN) / REWARD_STD, {"raw": raw}
