"""Tiny, randomly initialised but complete pipelines of every model family, in diffusers' format.

    python -m diffusion.tiny --family sd3|flux|sana|qwen_image --out DIR [--seed 0]

Each is the family's real architecture at toy sizes (the transformer, its text encoders with
word-level tokenizers built offline, its VAE, its scheduler), seeded, saved with `save_pretrained`
(safetensors, well under 2 MB): what the tests load through `diffusion.loading.load_policy` and
compare with the family's diffusers pipeline, as diffusers' own pipeline tests build dummy components.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from diffusers import DiffusionPipeline

from diffusion.tiny.flux import build_flux
from diffusion.tiny.qwen_image import build_qwen_image
from diffusion.tiny.sana import build_sana
from diffusion.tiny.sd3 import build_sd3

BUILDERS: dict[str, Callable[[int], DiffusionPipeline]] = {
    "sd3": build_sd3, "flux": build_flux, "sana": build_sana, "qwen_image": build_qwen_image,
}


def build_tiny_pipeline(family: str, seed: int = 0) -> DiffusionPipeline:
    if family not in BUILDERS:
        raise ValueError(f"no tiny pipeline for family {family!r}; known: {', '.join(BUILDERS)}")
    return BUILDERS[family](seed)


def save_tiny_pipeline(family: str, out: str | Path, seed: int = 0) -> Path:
    """Build the family's tiny pipeline and save it to `out` (safetensors only); returns the folder."""
    folder = Path(out)
    build_tiny_pipeline(family, seed).save_pretrained(folder, safe_serialization=True)
    return folder
