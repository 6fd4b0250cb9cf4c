"""aesthetic: the LAION improved aesthetic predictor (≈ 1–10, higher is more beautiful); prompts unused.

reward = MLP(e / ‖e‖),   e = CLIP ViT-L/14 image embedding (`get_image_features`, 768-d)

MLP = Linear(768, 1024) → Dropout(0.2) → Linear(1024, 128) → Dropout(0.2) → Linear(128, 64) →
Dropout(0.1) → Linear(64, 16) → Linear(16, 1), without activations (the ReLUs are commented out in
the official file), run in eval mode (dropout off) and float32; weights
`sac+logos+ava1-l14-linearMSE.pth` (state-dict keys `layers.{0,2,4,6,7}.{weight,bias}`).

Official references: christophschuhmann/improved-aesthetic-predictor `simple_inference.py` (class
`MLP`, `normalized`: L2 normalisation of the CLIP image features, then the MLP), and the reward
the RL papers run, yifan123/flow_grpo `flow_grpo/aesthetic_scorer.py::AestheticScorer.__call__`
(transformers `CLIPModel` / `CLIPProcessor` of openai/clip-vit-large-patch14 on the images
rounded to uint8 by `flow_grpo/rewards.py::aesthetic_score`, `get_image_features`, divided by its
norm, MLP, squeezed).

Preprocessing follows that processor (shortest side to 224 bicubic, centre crop 224 at offset
(H − 224) // 2, CLIP mean / std) on the tensors, with the uint8 rounding and 8-bit resampling of
the official path emulated (`rewards.clip_embedding.ClipImageTransform.like_processor`; within
1/255 of the processor's pixel values, measured in tests/rewards/test_clip_rewards.py).

Folder layout (`path`, and `clip_path`, default `path/clip-vit-large-patch14`):

    path/sac+logos+ava1-l14-linearMSE.pth
        from github.com/christophschuhmann/improved-aesthetic-predictor (read with
        torch.load(weights_only=True), or through its safetensors twin
        `sac+logos+ava1-l14-linearMSE.safetensors` written by `rewards.state_dicts.convert_to_safetensors`)
    clip_path/config.json, model.safetensors (or pytorch_model.bin), preprocessor_config.json
        from huggingface.co/openai/clip-vit-large-patch14 (the clipscore folder serves)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rewards.base import Metadata, Reward, WeightFile, register_reward, require_files
from rewards.clip_embedding import ClipEmbedder, clip_model_files, clip_processor_files
from rewards.state_dicts import checkpoint_on_disk, load_state_dict

MLP_FILE = "sac+logos+ava1-l14-linearMSE.pth"
MLP_SOURCE = "github.com/christophschuhmann/improved-aesthetic-predictor (sac+logos+ava1-l14-linearMSE.pth)"
CLIP_SOURCE = "huggingface.co/openai/clip-vit-large-patch14"
CLIP_SUBFOLDER = "clip-vit-large-patch14"
EMBEDDING_DIM = 768


class AestheticMLP(nn.Module):
    """The predictor's head: linear layers with dropout between, no activations (simple_inference.py's MLP)."""

    def __init__(self, input_size: int = EMBEDDING_DIM) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.layers(embeddings)


def _folders(path: str | Path | None, clip_path: str | Path | None) -> tuple[Path, Path]:
    if path is None:
        raise ValueError(f"aesthetic needs option `path`: the folder with {MLP_FILE}")
    path = Path(path)
    return path, Path(clip_path) if clip_path is not None else path / CLIP_SUBFOLDER


@register_reward("aesthetic")
class Aesthetic(Reward):
    """The LAION aesthetic predictor: MLP on the L2-normalised CLIP ViT-L/14 image embedding."""

    reads_uint8 = True  # the processor transform rounds to 8 bits first, as flow_grpo's aesthetic_score

    def __init__(
        self,
        path: str | Path,
        clip_path: str | Path | None = None,
        device: str | None = None,
        batch_size: int = 32,
        dtype: str = "float32",
    ) -> None:
        """`path`: the folder with sac+logos+ava1-l14-linearMSE.pth (or its .safetensors twin).
        `clip_path`: the openai/clip-vit-large-patch14 folder (None → path/clip-vit-large-patch14).
        `device`: None → "cuda" if available, else "cpu". `batch_size`: images per forward.
        `dtype`: the CLIP model's dtype, "float32" (official), "float16" or "bfloat16"; the MLP runs in float32."""
        mlp_folder, clip_folder = _folders(path, clip_path)
        require_files(self.name, self.required_files(path=path, clip_path=clip_path))
        self.embedder = ClipEmbedder(clip_folder, clip_folder, transform="processor", text=False, device=device,
                                     dtype=dtype, batch_size=batch_size)
        if self.embedder.model.config.projection_dim != EMBEDDING_DIM:
            raise ValueError(f"the CLIP model in {clip_folder} embeds in {self.embedder.model.config.projection_dim} "
                             f"dimensions; the aesthetic MLP takes {EMBEDDING_DIM} (CLIP ViT-L/14)")
        self.mlp = AestheticMLP()
        self.mlp.load_state_dict(load_state_dict(checkpoint_on_disk(mlp_folder / MLP_FILE)))
        self.mlp.eval().requires_grad_(False).to(self.embedder.device)

    @classmethod
    def required_files(cls, **options: Any) -> list[WeightFile]:
        mlp_folder, clip_folder = _folders(options.get("path"), options.get("clip_path"))
        return [
            WeightFile(checkpoint_on_disk(mlp_folder / MLP_FILE), MLP_SOURCE),
            *clip_model_files(clip_folder, CLIP_SOURCE),
            *clip_processor_files(clip_folder, CLIP_SOURCE, tokenizer=False),
        ]

    def _compute(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        embeddings = self.embedder.image_embeddings(images)
        with torch.inference_mode():
            scores = self.mlp(embeddings.to(self.embedder.device)).squeeze(-1)
        return scores, {}
