"""The model-folder loader on real diffusers formats, and its errors.

A tiny but complete SD3.5 pipeline (`diffusion.tiny`: two CLIP encoders, T5, VAE, word-level tokenizers
built in memory) is saved with diffusers' own `save_pretrained`, loaded by `load_policy`, and must reproduce
`StableDiffusion3Pipeline`'s own sampling exactly.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from diffusion.config import ExploreConfig
from diffusion.embedded.model import build_text_encoder, build_tokenizer, build_transformer, save_model_folder
from diffusion.explore import ExploreEngine
from diffusion.families import SD3
from diffusion.loading import load_policy
from diffusion.noise import candidate_seeds, initial_noise

PROMPTS = ["a handwritten digit seven", "a drawing of the digit two"]


@pytest.fixture(scope="module")
def tiny_sd3_folder(tiny_folder):
    """The tiny SD3.5 pipeline (two CLIPs, T5, 16-channel VAE) saved by diffusers, and the pipeline."""
    return tiny_folder("sd3"), tiny_folder.pipeline("sd3")


def test_loaded_sd3_matches_the_diffusers_pipeline(tiny_sd3_folder):
    folder, pipe = tiny_sd3_folder
    policy = load_policy(folder)
    assert policy.family.name == "sd3" and policy.latent_shape == (16, 8, 8) and policy.scheduler["shift"] == 3.0
    seeds = candidate_seeds(0, 0, 0, len(PROMPTS))
    noise = initial_noise(seeds, policy.latent_shape)

    ours = policy.sample(PROMPTS, seeds, steps=4, solver="euler").x0
    theirs = pipe(PROMPTS, latents=noise.clone(), num_inference_steps=4, guidance_scale=1.0, height=16, width=16,
                  max_sequence_length=128, output_type="latent").images
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)

    images = pipe(PROMPTS, latents=noise.clone(), num_inference_steps=4, guidance_scale=1.0, height=16, width=16,
                  max_sequence_length=128, output_type="pt").images
    torch.testing.assert_close(policy.decode(ours), images, rtol=0, atol=1e-5)
    assert policy.decode(ours).shape == (2, 3, 16, 16)


def test_the_tiny_sd35_folder_is_small_and_runs_dpm_and_the_nvfp4_engine(tiny_sd3_folder):
    folder, _ = tiny_sd3_folder
    assert sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) < 2_000_000
    assert (folder / "text_encoder_3").is_dir() and (folder / "vae").is_dir()
    policy = load_policy(folder)
    seeds = candidate_seeds(0, 0, 2, 2)
    full = policy.sample(PROMPTS, seeds, steps=4, solver="dpm2").x0
    engine = ExploreEngine(policy, ExploreConfig(precision="nvfp4", min_dim=0, allow_emulation=True))
    assert engine.plan.linears and not any(s in n for n in engine.plan.linears for s in SD3.quant.skip)
    low = policy.sample(PROMPTS, seeds, steps=4, solver="dpm2", transformer=engine.module).x0
    images = policy.decode(low)
    assert images.shape == (2, 3, 16, 16) and bool(torch.isfinite(images).all())
    assert not torch.equal(low, full)
    targets = {name for name, _ in policy.transformer.named_modules()}
    assert all(any(n.endswith(t) for n in targets) for t in policy.family.lora_targets)


def test_cfg_matches_the_pipeline_guidance(tiny_sd3_folder):
    folder, pipe = tiny_sd3_folder
    policy = load_policy(folder)
    seeds = candidate_seeds(0, 0, 1, len(PROMPTS))
    noise = initial_noise(seeds, policy.latent_shape)
    ours = policy.sample(PROMPTS, seeds, steps=3, cfg_scale=4.5).x0
    theirs = pipe(PROMPTS, latents=noise.clone(), num_inference_steps=3, guidance_scale=4.5, height=16, width=16,
                  max_sequence_length=128, output_type="latent").images
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_prompt_encoding_is_cached_per_prompt(tiny_sd3_folder):
    policy = load_policy(tiny_sd3_folder[0])
    first = policy.encode([PROMPTS[0], PROMPTS[1], PROMPTS[0]])
    assert len(policy._prompt_cache) == 2
    assert torch.equal(first["prompt_embeds"][0], first["prompt_embeds"][2])
    # CLIP tokens (12) then T5 tokens (128, the official script's length), widths padded to joint_attention_dim
    assert first["prompt_embeds"].shape == (3, 12 + 128, 32) and first["pooled_projections"].shape == (3, 24)


def test_embedded_save_load_round_trip_is_exact(tmp_path):
    torch.manual_seed(5)
    tokenizer, transformer = build_tokenizer(), build_transformer().eval()
    text_encoder = build_text_encoder(tokenizer).eval()
    save_model_folder(tmp_path / "m", transformer, text_encoder, tokenizer)
    policy = load_policy(tmp_path / "m")
    x, sigma = torch.randn(3, 1, 16, 16), torch.tensor([0.9, 0.5, 0.1])
    components = {"tokenizer": tokenizer, "text_encoder": text_encoder, "transformer": transformer}
    for name, module in (("transformer", transformer), ("text_encoder", text_encoder)):
        saved, loaded = module.state_dict(), policy.components[name].state_dict()
        assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved), name
    with torch.no_grad():
        cond = SD3.encode(components, PROMPTS + PROMPTS[:1])
        expected = SD3.velocity(transformer, x, sigma, cond)
    assert torch.equal(policy.velocity(x, sigma, cond), expected)
    # the same prompts through the policy's cache: equal up to the text encoder's last bit (CLIP's pooled
    # output moves by ~1e-7 with the batch and the tensors' memory, not with the weights)
    torch.testing.assert_close(policy.encode(PROMPTS + PROMPTS[:1]), cond, rtol=0, atol=1e-6)
    assert len(policy.components["tokenizer"]) == len(tokenizer)


def test_missing_weights_name_the_file(tmp_path, tiny_sd3_folder):
    folder = tmp_path / "broken"
    shutil.copytree(tiny_sd3_folder[0], folder)
    for weights in (folder / "transformer").glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(FileNotFoundError, match=r"transformer has no \*\.safetensors"):
        load_policy(folder)


def test_missing_component_and_index_are_named(tmp_path, tiny_sd3_folder):
    folder = tmp_path / "no_vae"
    shutil.copytree(tiny_sd3_folder[0], folder)
    shutil.rmtree(folder / "vae")
    with pytest.raises(FileNotFoundError, match=r"vae is missing: component 'vae' is listed in model_index\.json"):
        load_policy(folder)
    (folder / "model_index.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"model_index\.json is missing"):
        load_policy(folder)
    with pytest.raises(FileNotFoundError, match="the model folder does not exist"):
        load_policy(tmp_path / "nowhere")


def test_pickle_weights_are_never_loaded(tmp_path, tiny_sd3_folder):
    folder = tmp_path / "pickled"
    shutil.copytree(tiny_sd3_folder[0], folder)
    weights = next((folder / "text_encoder").glob("*.safetensors"))
    weights.rename(weights.with_name("pytorch_model.bin"))
    with pytest.raises(FileNotFoundError, match="only safetensors are loaded"):
        load_policy(folder)


def test_an_unknown_family_is_refused(tmp_path, tiny_sd3_folder):
    folder = tmp_path / "other"
    shutil.copytree(tiny_sd3_folder[0], folder)
    config_path = folder / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config["_class_name"] = "MysteryTransformer"
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"no model family for transformer class 'MysteryTransformer'.*SD3Transfor"):
        load_policy(folder)
