"""The Qwen-Image family on the tiny Qwen-Image pipeline (`diffusion.tiny.qwen_image`): saved with diffusers' own
`save_pretrained`, loaded by `load_policy`, it must reproduce `QwenImagePipeline`'s prompt encoding, sampling
(true CFG on and off) and decoding, sample with DPM and through the NVFP4 explore engine, and expose its LoRA
targets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusion.config import ExploreConfig
from diffusion.explore import ExploreEngine
from diffusion.families import QWEN_IMAGE
from diffusion.families.flux import pack_latents, unpack_latents
from diffusion.families.qwen_image import PROMPT_TEMPLATE, TEMPLATE_DROP
from diffusion.loading import check_model_folder, load_policy
from diffusion.noise import candidate_seeds, initial_noise

# Prompts of different lengths, so a batch pads one of them.
PROMPTS = ["a photo of a red cat", "a sign that says seven"]
RESOLUTION = 16  # pixels: 8×8 latent cells of 4 channels, 16 packed tokens


@pytest.fixture(scope="module")
def qwen(tiny_folder):
    """(folder, diffusers pipeline, loaded policy) of the tiny Qwen-Image pipeline."""
    folder = tiny_folder("qwen_image")
    return folder, tiny_folder.pipeline("qwen_image"), load_policy(folder, resolution=RESOLUTION)


def test_folder_is_small_valid_and_loads_as_qwen_image(qwen):
    folder, pipe, policy = qwen
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    assert size < 2_000_000, f"the tiny Qwen-Image folder is {size} bytes"
    check_model_folder(folder)
    assert policy.family.name == "qwen_image" and policy.latent_shape == (4, 8, 8)
    assert policy.guidance is None and QWEN_IMAGE.negative_prompt == " "
    # the word tokenizer splits the pipeline's system turn into the same 34 tokens as Qwen2's BPE
    assert pipe.prompt_template_encode == PROMPT_TEMPLATE and pipe.prompt_template_encode_start_idx == TEMPLATE_DROP
    assert len(policy.components["tokenizer"](PROMPT_TEMPLATE.split("{}")[0]).input_ids) == TEMPLATE_DROP


def test_prompt_encoding_is_the_pipelines_and_a_batch_pads_with_its_mask(qwen):
    _, pipe, policy = qwen
    lengths = []
    for prompt in PROMPTS:
        ours = policy.encode([prompt])
        embeds, mask = pipe.encode_prompt(prompt, device="cpu", max_sequence_length=QWEN_IMAGE.max_sequence_length)
        assert mask is None  # one prompt alone: every token valid, so the pipeline drops its mask
        torch.testing.assert_close(ours["prompt_embeds"], embeds, rtol=0, atol=1e-5)
        assert ours["prompt_embeds_mask"].tolist() == [[1] * embeds.shape[1]]
        lengths.append(embeds.shape[1])
    assert lengths[0] != lengths[1]
    # a batch: each prompt encoded alone (the cache), padded to the longest with zeros and a 0 mask
    batch = policy.encode(PROMPTS)
    embeds, mask = pipe.encode_prompt(PROMPTS, device="cpu", max_sequence_length=QWEN_IMAGE.max_sequence_length)
    torch.testing.assert_close(batch["prompt_embeds"], embeds, rtol=0, atol=1e-5)
    assert torch.equal(batch["prompt_embeds_mask"], mask)
    assert batch["prompt_embeds_mask"].sum(1).tolist() == lengths


@pytest.mark.parametrize("cfg_scale", [1.0, 4.0])
def test_sampling_and_decoding_match_the_qwen_image_pipeline(qwen, cfg_scale):
    _, pipe, policy = qwen
    seeds = candidate_seeds(0, 0, 0, len(PROMPTS))
    noise = pack_latents(initial_noise(seeds, policy.latent_shape))
    negative = [QWEN_IMAGE.negative_prompt] * len(PROMPTS) if cfg_scale > 1 else None
    call = dict(num_inference_steps=4, true_cfg_scale=cfg_scale, negative_prompt=negative, height=RESOLUTION,
                width=RESOLUTION, max_sequence_length=QWEN_IMAGE.max_sequence_length)

    ours = policy.sample(PROMPTS, seeds, steps=4, cfg_scale=cfg_scale).x0
    packed = pipe(PROMPTS, output_type="latent", latents=noise.clone(), **call).images
    # the pipeline's grid (dynamic, exponential shift from 16 tokens, terminal σ 0.02) is ours, bit for bit
    assert torch.equal(policy.sigmas(4), pipe.scheduler.sigmas.float())
    torch.testing.assert_close(ours, unpack_latents(packed, 8, 8), rtol=0, atol=1e-5)

    images = pipe(PROMPTS, output_type="pt", latents=noise.clone(), **call).images
    decoded = policy.decode(ours)
    assert decoded.shape == (2, 3, RESOLUTION, RESOLUTION)
    torch.testing.assert_close(decoded, images, rtol=0, atol=1e-5)


def test_guidance_rescales_each_token_to_the_conditional_norm(qwen):
    _, _, policy = qwen
    v_u, v_c = torch.randn(2, *policy.latent_shape), torch.randn(2, *policy.latent_shape)
    guided = QWEN_IMAGE.guide(v_u, v_c, 4.0)
    # the pipeline's formula on its packed tokens
    pu, pc = pack_latents(v_u), pack_latents(v_c)
    combined = pu + 4.0 * (pc - pu)
    expected = combined * (pc.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(pack_latents(guided), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(pack_latents(guided).norm(dim=-1), pc.norm(dim=-1))
    assert not torch.allclose(guided, v_u + 4.0 * (v_c - v_u))


def test_sigmas_static_shift_and_resolution(qwen):
    _, pipe, policy = qwen
    scheduler = policy.scheduler
    # more tokens → larger mu → a grid shifted further towards noise; the terminal σ stays 0.02
    small, large = QWEN_IMAGE.sigmas(5, scheduler, (4, 8, 8)), QWEN_IMAGE.sigmas(5, scheduler, (4, 128, 128))
    assert (large[1:-2] > small[1:-2]).all()
    assert small[-2].item() == pytest.approx(0.02) and large[-2].item() == pytest.approx(0.02) and small[-1] == 0
    # an explicit shift replaces the dynamic one (and its exponential form)
    assert not torch.equal(policy.sigmas(5, shift=1.0), policy.sigmas(5))
    with pytest.raises(ValueError, match="multiple of 4"):
        QWEN_IMAGE.latent_shape(policy.components, 18)
    assert QWEN_IMAGE.latent_shape(policy.components, None) == (4, 128, 128)  # the pipeline's default sample size
    assert QWEN_IMAGE.vae_scale(policy.components) == pipe.vae_scale_factor == 2
    # one image token per 2×2 patch of latent cells: 4096 at 1024 px (128×128 cells), as FLUX
    assert QWEN_IMAGE.image_tokens((16, 128, 128), policy.transformer.config) == 4096
    assert QWEN_IMAGE.image_tokens(policy.latent_shape, policy.transformer.config) == packed_tokens(policy) == 16


def packed_tokens(policy) -> int:
    return pack_latents(torch.zeros(1, *policy.latent_shape)).shape[1]


@pytest.mark.parametrize(("precision", "backend"), [("nvfp4", "auto"), ("fp8", "auto"), ("fp8", "torchao")])
def test_dpm_sampling_and_the_low_precision_engines(qwen, precision, backend):
    _, _, policy = qwen
    seeds = candidate_seeds(0, 1, 0, len(PROMPTS))
    full = policy.sample(PROMPTS, seeds, steps=4, solver="dpm2").x0
    assert full.shape == (2, 4, 8, 8) and torch.isfinite(full).all()
    images = policy.decode(full)
    assert images.shape == (2, 3, RESOLUTION, RESOLUTION) and torch.isfinite(images).all()

    config = ExploreConfig(precision=precision, backend=backend, min_dim=0, skip=None, allow_emulation=True)
    engine = ExploreEngine(policy, config)
    assert engine.plan.linears and not any(s in n for n in engine.plan.linears for s in QWEN_IMAGE.quant.skip)
    low = policy.sample(PROMPTS, seeds, steps=4, solver="dpm2", transformer=engine.module).x0
    assert torch.isfinite(low).all() and not torch.allclose(low, full)
    assert np.isfinite(policy.decode(low).numpy()).all()


def test_lora_targets_name_modules_of_the_transformer(qwen):
    _, _, policy = qwen
    names = [name for name, _ in policy.transformer.named_modules()]
    for target in QWEN_IMAGE.lora_targets:
        assert any(name.endswith(target) for name in names), target


def test_a_plain_transformer_made_on_the_meta_device_keeps_the_rope_tables(qwen):
    """`QwenEmbedRope` keeps its tables as plain tensor attributes, in no state dict: rebuilt on the meta device
    (`plain_transformer`, how evaluation and export make the transformer), they come from the template."""
    from learner.evaluation import plain_transformer

    _, _, policy = qwen
    model = plain_transformer(policy.transformer, dict(policy.transformer.state_dict()))
    assert not model.pos_embed.pos_freqs.is_meta and not model.pos_embed.neg_freqs.is_meta
    cond = policy.encode(PROMPTS)
    x, sigma = torch.randn(2, *policy.latent_shape), torch.tensor([0.8, 0.3])
    assert torch.equal(policy.velocity(x, sigma, cond, transformer=model), policy.velocity(x, sigma, cond))
