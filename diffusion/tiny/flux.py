"""A tiny, complete FLUX.1-dev pipeline: CLIP (pooled) + T5 (word tokenizers), 16-channel VAE, dynamic shift."""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

from diffusion.tiny.tokenizer import word_tokenizer

CLIP_TOKENS = 12
T5_TOKENS = 128  # the tokenizer's own limit; the family pads prompts to its t5_max_sequence_length

# FLUX.1-dev's scheduler_config.json: resolution-dependent ("dynamic") time shift.
FLUX_DEV_SCHEDULER = {
    "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True,
    "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256, "max_image_seq_len": 4096,
}


def build_flux(seed: int = 0) -> FluxPipeline:
    """FLUX.1-dev's components at toy sizes: a transformer of one double-stream and one single-stream
    block (width 16, `guidance_embeds=True`), a 16-channel VAE of scale 2 (so 16×16 px images are 8×8
    latents, 16 packed tokens) with FLUX's scaling/shift factors and no quant convs, and FLUX.1-dev's
    scheduler config; every weight seeded from `seed`."""
    tokenizer = word_tokenizer(CLIP_TOKENS)
    vocab = len(tokenizer)
    torch.manual_seed(seed)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, projection_dim=16, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=CLIP_TOKENS, pad_token_id=0, bos_token_id=2, eos_token_id=3,
    )).eval()
    torch.manual_seed(seed + 1)
    t5 = T5EncoderModel(T5Config(vocab_size=vocab, d_model=32, d_ff=37, d_kv=8, num_layers=2, num_heads=4,
                                 decoder_start_token_id=0)).eval()
    torch.manual_seed(seed + 2)
    # axes_dims_rope must sum to attention_head_dim (RoPE over the (0, row, column) ids).
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=True,
        axes_dims_rope=(2, 2, 4),
    ).eval()
    torch.manual_seed(seed + 3)
    vae = AutoencoderKL(block_out_channels=(8, 16), in_channels=3, out_channels=3, latent_channels=16,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        norm_num_groups=8, sample_size=16, shift_factor=0.1159, scaling_factor=0.3611,
                        use_quant_conv=False, use_post_quant_conv=False).eval()
    return FluxPipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER), vae=vae,
        text_encoder=clip, tokenizer=tokenizer, text_encoder_2=t5, tokenizer_2=word_tokenizer(T5_TOKENS, bos=False),
    )
