"""FLUX.1 (dev): `FluxTransformer2DModel`, CLIP-L pooled + T5, packed 2×2 latents, distilled guidance."""

from __future__ import annotations

from diffusion.families.base import Family, QuantPolicy

FLUX = Family(
    name="flux",
    transformer_class="FluxTransformer2DModel",
    # FLUX.1-dev: 495 of its 504 Linears run in NVFP4 (every block layer, and proj_out).
    quant=QuantPolicy(skip=("x_embedder", "context_embedder", "time_text_embed", "norm_out"), min_dim=1000),
    lora_targets=("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0"),
    supported=False,
    note="FLUX.1 prompt encoding (CLIP pooled + T5) and latent packing come in a later issue",
)
