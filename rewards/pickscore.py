"""pickscore (PickScore v1, from Pick-a-Pic): how much people would prefer the image for the prompt.

reward = exp(logit_scale) · cos(image embedding, text embedding) / 26

The model is `yuvalkirstain/PickScore_v1`, a fine-tune of CLIP ViT-H/14; the processor (image
preprocessing and tokenizer) is that of `laion/CLIP-ViT-H-14-laion2B-s32B-b79K`. The official
reward is `PickScoreScorer.__call__` in yifan123/flow_grpo `flow_grpo/pickscore_scorer.py`, the same
as NVlabs/Sana `diffusion/post_training/rewards.py::PickScoreScorer` (Sol-RL): CLIP processor on the
images and on the prompts (truncated to 77 tokens), `get_image_features` / `get_text_features`,
both L2-normalised, `logit_scale.exp() · text @ image.T`, diagonal, divided by 26 (flow_grpo's
"norm to 0-1"; the raw PickScore is the logit of the model card's `calc_probs`, yuvalkirstain/PickScore
`README.md`, before its softmax over images).

Preprocessing follows transformers' `CLIPImageProcessor` with the laion processor's settings
(shortest side to 224 with bicubic resampling, centre crop 224 at offset (H − 224) // 2, CLIP
mean / std), done on the tensors (`rewards.clip_embedding.ClipImageTransform.like_processor`),
including what the official uint8 path does: `pickscore_score` rounds the images to uint8, and
PIL resamples 8-bit images one axis at a time with a rounded, saturated intermediate. The pixel
values come within 1/255 of transformers' PIL processor (2/255 of its torchvision processor, which
is as far from the PIL one); tests/rewards/test_clip_rewards.py measures it on a photograph.

Folder layout (`path`, and `processor_path`, default `path/processor`):

    path/config.json, path/model.safetensors
        from huggingface.co/yuvalkirstain/PickScore_v1 (a folder with only the release's
        pytorch_model.bin works too: it is read with torch.load(weights_only=True), or through its
        safetensors twin from `rewards.state_dicts.convert_to_safetensors`)
    processor_path/preprocessor_config.json, vocab.json, merges.txt, tokenizer_config.json
        from huggingface.co/laion/CLIP-ViT-H-14-laion2B-s32B-b79K (tokenizer.json and
        special_tokens_map.json are read too when present)

`details` reports per sample `cosine` (the cosine similarity of the two embeddings).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rewards.base import Metadata, Reward, WeightFile, register_reward, require_files
from rewards.clip_embedding import ClipEmbedder, clip_model_files, clip_processor_files

MODEL_SOURCE = "huggingface.co/yuvalkirstain/PickScore_v1"
PROCESSOR_SOURCE = "huggingface.co/laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
PROCESSOR_SUBFOLDER = "processor"
SCORE_SCALE = 26.0


def _folders(path: str | Path | None, processor_path: str | Path | None) -> tuple[Path, Path]:
    if path is None:
        raise ValueError("pickscore needs option `path`: the folder with PickScore_v1's config.json and weights")
    path = Path(path)
    return path, Path(processor_path) if processor_path is not None else path / PROCESSOR_SUBFOLDER


@register_reward("pickscore")
class PickScore(Reward):
    """exp(logit_scale) · cos(image, prompt) / 26 under PickScore v1 (CLIP ViT-H/14)."""

    reads_uint8 = True  # the processor transform rounds to 8 bits first, as flow_grpo's pickscore_score

    def __init__(
        self,
        path: str | Path,
        processor_path: str | Path | None = None,
        device: str | None = None,
        batch_size: int = 32,
        dtype: str = "float32",
    ) -> None:
        """`path`: the folder with PickScore_v1's config.json and model.safetensors (or pytorch_model.bin).
        `processor_path`: the folder with the laion CLIP-ViT-H-14 processor files (None → path/processor).
        `device`: None → "cuda" if available, else "cpu". `batch_size`: images (and prompts) per forward.
        `dtype`: the model's dtype, "float32" (official), "float16" or "bfloat16"."""
        model_path, processor_path = _folders(path, processor_path)
        require_files(self.name, self.required_files(path=path, processor_path=processor_path))
        self.embedder = ClipEmbedder(model_path, processor_path, transform="processor", device=device,
                                     dtype=dtype, batch_size=batch_size)

    @classmethod
    def required_files(cls, **options: Any) -> list[WeightFile]:
        model_path, processor_path = _folders(options.get("path"), options.get("processor_path"))
        return [*clip_model_files(model_path, MODEL_SOURCE), *clip_processor_files(processor_path, PROCESSOR_SOURCE)]

    def _compute(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cosine = (self.embedder.image_embeddings(images) * self.embedder.text_embeddings(prompts)).sum(dim=-1)
        return self.embedder.logit_scale * cosine / SCORE_SCALE, {"cosine": cosine}
