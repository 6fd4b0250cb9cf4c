"""The FLUX.1 family on the tiny FLUX pipeline (`diffusion.tiny.flux`): saved with diffusers' own
`save_pretrained`, loaded by `load_policy`, it must reproduce `FluxPipeline`'s sampling and decoding,
sample with DPM and through the NVFP4 explore engine, and expose its LoRA targets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusion.config import ExploreConfig
from diffusion.explore import ExploreEngine
from diffusion.families import FLUX
from diffusion.families.flux import latent_image_ids, pack_latents, unpack_latents
from diffusion.loading import check_model_folder, load_policy
from diffusion.noise import candidate_seeds, initial_noise

PROMPTS = ["a photo of a red cat", "a sign that says seven"]
RESOLUTION = 16  # pixels: 8×8 latent cells of 16 channels, 16 packed tokens


@pytest.fixture(scope="module")
def flux(tiny_folder):
    """(folder, diffusers pipeline, loaded policy) of the tiny FLUX pipeline."""
    folder = tiny_folder("flux")
    return folder, tiny_folder.pipeline("flux"), load_policy(folder, resolution=RESOLUTION)


def test_folder_is_small_valid_and_loads_as_flux(flux):
    folder, _, policy = flux
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    assert size < 2_000_000, f"the tiny FLUX folder is {size} bytes"
    check_model_folder(folder)
    assert policy.family.name == "flux" and policy.latent_shape == (16, 8, 8)
    assert policy.guidance == FLUX.default_guidance == 1.0
    cond = policy.encode(PROMPTS)
    assert cond["prompt_embeds"].shape == (2, FLUX.t5_max_sequence_length, 32)
    assert cond["pooled_projections"].shape == (2, 16) and cond["guidance"].tolist() == [1.0, 1.0]


def test_packing_is_the_pipelines(flux):
    _, pipe, _ = flux
    x = torch.randn(3, 16, 8, 6)
    packed = pack_latents(x)
    assert torch.equal(packed, pipe._pack_latents(x, 3, 16, 8, 6))
    assert torch.equal(unpack_latents(packed, 8, 6), x)
    ids = pipe._prepare_latent_image_ids(3, 4, 3, "cpu", torch.float32)
    assert torch.equal(latent_image_ids(8, 6, device=torch.device("cpu"), dtype=torch.float32), ids)


@pytest.mark.parametrize("guidance", [None, 3.5])
def test_sampling_and_decoding_match_the_flux_pipeline(flux, guidance):
    folder, pipe, _ = flux
    policy = load_policy(folder, resolution=RESOLUTION, guidance=guidance)
    seeds = candidate_seeds(0, 0, 0, len(PROMPTS))
    noise = pack_latents(initial_noise(seeds, policy.latent_shape))
    call = dict(latents=noise, num_inference_steps=4, guidance_scale=policy.guidance, height=RESOLUTION,
                width=RESOLUTION, max_sequence_length=FLUX.t5_max_sequence_length)

    ours = policy.sample(PROMPTS, seeds, steps=4).x0
    packed = pipe(PROMPTS, output_type="latent", **{**call, "latents": noise.clone()}).images
    # the pipeline's dynamic-shift grid (mu from 16 tokens) is ours, bit for bit
    assert torch.equal(policy.sigmas(4), pipe.scheduler.sigmas.float())
    torch.testing.assert_close(ours, unpack_latents(packed, 8, 8), rtol=0, atol=1e-5)

    images = pipe(PROMPTS, output_type="pt", **{**call, "latents": noise.clone()}).images
    decoded = policy.decode(ours)
    assert decoded.shape == (2, 3, RESOLUTION, RESOLUTION)
    torch.testing.assert_close(decoded, images, rtol=0, atol=1e-5)


def test_guidance_changes_the_velocity(flux):
    _, _, policy = flux
    cond = policy.encode(PROMPTS)
    x, sigma = torch.randn(2, *policy.latent_shape), torch.tensor([0.8, 0.3])
    other = {**cond, "guidance": torch.full((2,), 4.0)}
    assert not torch.allclose(policy.velocity(x, sigma, cond), policy.velocity(x, sigma, other))
    with pytest.raises(ValueError, match="guidance"):
        policy.velocity(x, sigma, {k: v for k, v in cond.items() if k != "guidance"})


def test_sigmas_static_shift_and_resolution(flux):
    _, _, policy = flux
    # an explicit shift replaces the dynamic one: shift 1 leaves the pipeline's linspace as it is
    expected = np.append(np.linspace(1.0, 1 / 5, 5), 0.0).astype(np.float32)
    assert np.array_equal(policy.sigmas(5, shift=1.0).numpy(), expected)
    # more tokens → larger mu → a grid shifted further towards noise
    scheduler = policy.scheduler
    assert (FLUX.sigmas(5, scheduler, (16, 64, 64))[1:-1] > FLUX.sigmas(5, scheduler, (16, 8, 8))[1:-1]).all()
    with pytest.raises(ValueError, match="multiple of 4"):
        FLUX.latent_shape(policy.components, 18)
    assert FLUX.latent_shape(policy.components, None) == (16, 128, 128)  # the pipeline's default sample size


def test_dpm_sampling_and_the_nvfp4_engine(flux):
    _, _, policy = flux
    seeds = candidate_seeds(0, 1, 0, len(PROMPTS))
    full = policy.sample(PROMPTS, seeds, steps=4, solver="dpm2").x0
    assert full.shape == (2, 16, 8, 8) and torch.isfinite(full).all()
    images = policy.decode(full)
    assert images.shape == (2, 3, RESOLUTION, RESOLUTION) and torch.isfinite(images).all()

    engine = ExploreEngine(policy, ExploreConfig(precision="nvfp4", min_dim=0, skip=None, allow_emulation=True))
    assert engine.plan.linears and not any(s in n for n in engine.plan.linears for s in FLUX.quant.skip)
    low = policy.sample(PROMPTS, seeds, steps=4, solver="dpm2", transformer=engine.module).x0
    assert torch.isfinite(low).all() and not torch.allclose(low, full)


def test_lora_targets_name_modules_of_the_transformer(flux):
    _, _, policy = flux
    names = [name for name, _ in policy.transformer.named_modules()]
    for target in FLUX.lora_targets:
        assert any(name.endswith(target) for name in names), target
