"""A tiny, complete Qwen-Image pipeline: a Qwen2.5-VL text encoder (word tokenizer), a causal 3D VAE, dynamic shift."""

from __future__ import annotations

import torch
from diffusers import (
    AutoencoderKLQwenImage,
    FlowMatchEulerDiscreteScheduler,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
)
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from diffusion.families.qwen_image import TEMPLATE_DROP, TOKENIZER_MAX_LENGTH
from diffusion.tiny.tokenizer import chat_tokenizer

# Qwen/Qwen-Image's scheduler_config.json: a dynamic, exponential time shift that ends at σ = 0.02.
QWEN_IMAGE_SCHEDULER = {
    "num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 0.9,
    "base_image_seq_len": 256, "max_image_seq_len": 8192, "shift_terminal": 0.02, "time_shift_type": "exponential",
    "invert_sigmas": False, "stochastic_sampling": False, "use_karras_sigmas": False, "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
}
TEXT_WIDTH = 32  # the text encoder's hidden size = the transformer's joint_attention_dim
Z_DIM = 4


def build_qwen_image(seed: int = 0) -> QwenImagePipeline:
    """Qwen-Image's components at toy sizes: a Qwen2.5-VL (2 text layers of width 32, multimodal RoPE,
    a one-block vision tower that prompts never reach), a transformer of two dual-stream blocks (width
    16), a VAE of scale 2 with 4 latent channels (16×16 px images are 8×8 latents, 16 packed tokens)
    whose per-channel `latents_mean` / `latents_std` are not the identity, and Qwen-Image's scheduler
    config; every weight seeded from `seed`."""
    tokenizer = chat_tokenizer(TOKENIZER_MAX_LENGTH + TEMPLATE_DROP)
    torch.manual_seed(seed)
    text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer), "hidden_size": TEXT_WIDTH, "intermediate_size": 37, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 2048,
            # head_dim 16: the three mRoPE sections (time, height, width) cover its 8 frequencies
            "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [2, 3, 3]},
        },
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": TEXT_WIDTH, "fullatt_block_indexes": [0]},
        # Qwen2.5-VL's: <|endoftext|> begins and pads, <|im_end|> ends
        bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )).eval()
    torch.manual_seed(seed + 1)
    # axes_dims_rope must sum to attention_head_dim (RoPE over frame, row and column).
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=4 * Z_DIM, out_channels=Z_DIM, num_layers=2, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=TEXT_WIDTH, axes_dims_rope=(2, 2, 4),
    ).eval()
    generator = torch.Generator().manual_seed(seed + 2)
    latents_mean = (0.2 * torch.randn(Z_DIM, generator=generator)).tolist()
    latents_std = (0.5 + torch.rand(Z_DIM, generator=generator)).tolist()
    torch.manual_seed(seed + 3)
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=Z_DIM, dim_mult=[1, 2], num_res_blocks=1,
                                 temperal_downsample=[False], latents_mean=latents_mean, latents_std=latents_std).eval()
    return QwenImagePipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER), vae=vae,
        text_encoder=text_encoder, tokenizer=tokenizer,
    )
