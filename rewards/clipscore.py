"""clipscore: how well the image matches the prompt under CLIP ViT-L/14 (`openai/clip-vit-large-patch14`).

reward = logits_per_image.diag() / 100 = exp(logit_scale) · cos(image embedding, text embedding) / 100

With the release's logit_scale (ln 100) this is the cosine of the two embeddings (≈ 0.3 for a
matching prompt). The official reward is `ClipScorer.__call__` in NVlabs/Sana
`diffusion/post_training/rewards.py` (Sol-RL's `clipscore`, reached through `clip_score`): the prompts
through the CLIP tokenizer (`padding="max_length"`, truncated to 77 tokens), the images through
`_get_clip_image_transform` — torchvision `T.Resize(224)` of the shortest side (bilinear,
antialiased: torchvision's defaults), `T.CenterCrop(224)`, `T.Normalize` with the CLIP mean / std —
on the float tensors, then `CLIPModel(...).logits_per_image.diagonal() / 100`. yifan123/flow_grpo
`flow_grpo/clip_scorer.py::ClipScorer` (the version its `rewards.py::clip_score` calls) is the same
code but divides by 30 instead of 100.

Here the same transform is written with tensor ops (`rewards.clip_embedding.ClipImageTransform.
like_torchvision`: `F.interpolate(bilinear, antialias=True)`, crop offset round((H − 224) / 2) as
torchvision's `center_crop`), and the formula is computed from the normalised embeddings:
exp(logit_scale) · (image · text) / 100, which is the diagonal of `logits_per_image` / 100.

Folder layout (`path`), all from huggingface.co/openai/clip-vit-large-patch14:

    config.json, model.safetensors (or pytorch_model.bin, read with torch.load(weights_only=True)
    or through its safetensors twin), preprocessor_config.json, vocab.json, merges.txt,
    tokenizer_config.json (tokenizer.json and special_tokens_map.json are read too when present)

`details` reports per sample `cosine` (the cosine similarity of the two embeddings).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rewards.base import Metadata, Reward, WeightFile, register_reward, require_files
from rewards.clip_embedding import ClipEmbedder, clip_model_files, clip_processor_files

SOURCE = "huggingface.co/openai/clip-vit-large-patch14"
SCORE_SCALE = 100.0


def _folder(path: str | Path | None) -> Path:
    if path is None:
        raise ValueError("clipscore needs option `path`: the folder with openai/clip-vit-large-patch14's files")
    return Path(path)


@register_reward("clipscore")
class ClipScore(Reward):
    """exp(logit_scale) · cos(image, prompt) / 100 under CLIP ViT-L/14 (the cosine, for the release)."""

    reads_uint8 = False  # the torchvision transform reads the float tensor, as flow_grpo's clip_scorer

    def __init__(
        self, path: str | Path, device: str | None = None, batch_size: int = 32, dtype: str = "float32"
    ) -> None:
        """`path`: the folder with openai/clip-vit-large-patch14's model, processor and tokenizer files.
        `device`: None → "cuda" if available, else "cpu". `batch_size`: images (and prompts) per forward.
        `dtype`: the model's dtype, "float32" (official), "float16" or "bfloat16"."""
        folder = _folder(path)
        require_files(self.name, self.required_files(path=path))
        self.embedder = ClipEmbedder(folder, folder, transform="torchvision", device=device, dtype=dtype,
                                     batch_size=batch_size)

    @classmethod
    def required_files(cls, **options: Any) -> list[WeightFile]:
        folder = _folder(options.get("path"))
        return [*clip_model_files(folder, SOURCE), *clip_processor_files(folder, SOURCE)]

    def _compute(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cosine = (self.embedder.image_embeddings(images) * self.embedder.text_embeddings(prompts)).sum(dim=-1)
        return self.embedder.logit_scale * cosine / SCORE_SCALE, {"cosine": cosine}
