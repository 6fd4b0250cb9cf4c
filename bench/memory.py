"""Memory per actor of the paper presets, estimated on the real architectures (no weights, no GPU).

    python -m bench.memory [--json bench/results/memory.json]

Each model is built on the meta device from its published configuration (the transformer, its text
encoders and its VAE, as in the diffusers-format releases), and `cluster.check.estimate_memory` — the
preflight's formulas — gives GiB per learner and per explorer at the preset's settings, with and
without the memory options (gradient checkpointing, text encoders off the GPU), and with the lora
codec. An explorer holds one transformer (its engine is the policy's own, quantized in place); it held
two before (the policy's and the engine's copy): `explorer_saved` is the difference, one transformer
less the LoRA base weights the lora codec keeps. Estimates, not measurements: no GPU here can hold
these models.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from torch import nn

from cluster.check import estimate_memory
from cluster.config.loading import load_config
from diffusion.families import FLUX, QWEN_IMAGE, SANA, SD3

CLIP_L = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
              num_attention_heads=12, max_position_embeddings=77, projection_dim=768)
CLIP_G = dict(vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
              num_attention_heads=20, max_position_embeddings=77, projection_dim=1280)
T5_XXL = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
              feed_forward_proj="gated-gelu")
GEMMA2_2B = dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=256)
KL_VAE = dict(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
              layers_per_block=2, down_block_types=("DownEncoderBlock2D",) * 4,
              up_block_types=("UpDecoderBlock2D",) * 4)
SD35_LARGE = dict(sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=38, attention_head_dim=64,
                  num_attention_heads=38, joint_attention_dim=4096, caption_projection_dim=2432,
                  pooled_projection_dim=2048, pos_embed_max_size=192, qk_norm="rms_norm")
SD35_MEDIUM = dict(sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24, attention_head_dim=64,
                   num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
                   pooled_projection_dim=2048, pos_embed_max_size=384, qk_norm="rms_norm",
                   dual_attention_layers=tuple(range(13)))
# Qwen/Qwen-Image's text_encoder: Qwen2.5-VL-7B-Instruct (the whole model the pipeline loads, vision tower and
# LM head included). Its transformer and VAE configs are diffusers' class defaults.
QWEN25_VL_7B = dict(
    text_config=dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                     num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=128000,
                     rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}),
    vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                       fullatt_block_indexes=[7, 15, 23, 31], window_size=112),
    tie_word_embeddings=False)
FLUX_DEV = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True)


def _count(module: nn.Module) -> int:
    return sum(t.numel() for t in module.state_dict().values())


def models() -> dict[str, tuple]:
    """preset → (family, transformer, {component: parameters}, VAE) built on the meta device."""
    import diffusers
    import transformers as tf

    with torch.device("meta"):
        clip_l, clip_g = tf.CLIPTextModelWithProjection(tf.CLIPTextConfig(**CLIP_L)), \
            tf.CLIPTextModelWithProjection(tf.CLIPTextConfig(**CLIP_G))
        t5 = tf.T5EncoderModel(tf.T5Config(**T5_XXL))
        kl = diffusers.AutoencoderKL(**KL_VAE)
        sd3_text = {"text_encoder": _count(clip_l), "text_encoder_2": _count(clip_g), "text_encoder_3": _count(t5)}
        clip_l_plain = tf.CLIPTextModel(tf.CLIPTextConfig(**CLIP_L))  # FLUX takes CLIP-L's pooled output only
        flux_text = {"text_encoder": _count(clip_l_plain), "text_encoder_2": _count(t5)}
        gemma = {"text_encoder": _count(tf.Gemma2Model(tf.Gemma2Config(**GEMMA2_2B)))}
        dc = diffusers.AutoencoderDC()  # its defaults are SANA's DC-AE f32c32
        qwen_vl = {"text_encoder": _count(tf.Qwen2_5_VLForConditionalGeneration(tf.Qwen2_5_VLConfig(**QWEN25_VL_7B)))}
        return {
            "sd35_large": (SD3, diffusers.SD3Transformer2DModel(**SD35_LARGE), sd3_text, kl),
            "sd35_medium": (SD3, diffusers.SD3Transformer2DModel(**SD35_MEDIUM), sd3_text, kl),
            "flux_dev": (FLUX, diffusers.FluxTransformer2DModel(**FLUX_DEV), flux_text, kl),
            "sana_1600m": (SANA, diffusers.SanaTransformer2DModel(), gemma, dc),
            "qwen_image": (QWEN_IMAGE, diffusers.QwenImageTransformer2DModel(), qwen_vl,
                           diffusers.AutoencoderKLQwenImage()),
        }


def estimate(preset: str, family, transformer: nn.Module, text: dict[str, int], vae: nn.Module,
             overrides: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        vae.save_config(folder / "vae")  # what the latent shape reads
        config = load_config(f"configs/{preset}.yaml", [f"model.path={folder}", *overrides])
        params = {"transformer": _count(transformer), **text, "vae": _count(vae)}
        m = estimate_memory(config, transformer, family, params)
        # the engine's copy an explorer no longer holds, less the LoRA base it keeps instead (lora codec)
        copy = params["transformer"] * (4 if config.model.dtype == "float32" else 2) / 2**30
        return {**m, "explorer_saved": copy - m["explorer_lora_base"], "explorer_before": m["explorer"] + copy
                - m["explorer_lora_base"], **{f"{k}_params_b": v / 1e9 for k, v in params.items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    options = {"as preset": [], "no memory options": ["training.gradient_checkpointing=false",
                                                      "model.offload_text_encoders=false"],
               "lora codec": ["cluster.codec=lora"]}
    results: dict[str, dict[str, dict[str, float]]] = {}
    print("| preset | setting | transformer (B) | text encoders (B) | learner GiB | of which activations | "
          "explorer GiB | before (two transformers) | saved |\n|---|---|---|---|---|---|---|---|---|")
    for preset, (family, transformer, text, vae) in models().items():
        results[preset] = {}
        for name, overrides in options.items():
            m = estimate(preset, family, transformer, text, vae, overrides)
            results[preset][name] = m
            text_b = sum(v for k, v in m.items() if k.startswith("text_encoder"))
            print(f"| {preset} | {name} | {m['transformer_params_b']:.2f} | {text_b:.2f} | {m['learner']:.1f} | "
                  f"{m['learner_activations']:.1f} | {m['explorer']:.1f} | {m['explorer_before']:.1f} | "
                  f"{m['explorer_saved']:.1f} |")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
