"""The three memory options of a 1024-px run on one GPU, on CPU with the tiny SD3 pipeline: gradient
checkpointing of the trained transformer (same gradients), text encoders offloaded between encodings
(same conditioning, the encoders' moves observed) and sequential decoding (same images)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from diffusers import FluxTransformer2DModel, SanaTransformer2DModel, SD3Transformer2DModel
from torch import nn

from cluster.config.loading import load_config
from diffusion.config import ModelConfig
from diffusion.loading import load_policy, load_policy_from_config
from learner.config import TrainingConfig
from learner.objectives import nft_loss
from learner.training_state import TrainingState

PROMPTS = ["a red cat", "a sign that says seven", "a red cat"]


@pytest.fixture(scope="module")
def sd3_folder(tiny_folder):
    return tiny_folder("sd3")


@pytest.fixture(scope="module")
def sd3(sd3_folder):
    """The tiny SD3 policy, options off; its transformer is only deep-copied, never trained."""
    return load_policy(sd3_folder)


# ---- gradient checkpointing ------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [SD3Transformer2DModel, FluxTransformer2DModel, SanaTransformer2DModel])
def test_the_three_families_transformers_support_checkpointing(cls):
    assert cls._supports_gradient_checkpointing is True
    assert hasattr(cls, "enable_gradient_checkpointing")


def _state(policy, mode: str, checkpointing: bool) -> TrainingState:
    config = TrainingConfig(mode=mode, lora_rank=4, lora_alpha=8, gradient_checkpointing=checkpointing)
    state = TrainingState(copy.deepcopy(policy.transformer), config, family_targets=policy.family.lora_targets)
    # θ ≠ θ_old ≠ reference, identically in both states: LoRA B away from zero (else A gets no gradient),
    # full mode's θ moved off the copies.
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in state.theta_parameters().items():
            if mode == "full" or ".lora_B." in name:
                param.add_(0.05 * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return state


def _nft_gradients(policy, state: TrainingState) -> dict[str, torch.Tensor]:
    """One NFT micro-batch as `learner.updates.nft_update` runs it: θ_old and the reference without
    gradients, θ with, the backward inside the θ view."""
    generator = torch.Generator().manual_seed(2)
    batch = 2
    x0 = torch.randn(batch, *policy.latent_shape, generator=generator)
    eps = torch.randn(batch, *policy.latent_shape, generator=generator)
    t = torch.tensor([0.3, 0.8])
    x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
    advantages = torch.tensor([1.5, -2.0])
    cond = policy.encode(PROMPTS[:batch])
    cond = {k: v.clone() for k, v in cond.items()}  # out of inference mode: usable in autograd
    with state.use("old") as model:
        v_old = policy.velocity(x_t, t, cond, transformer=model).float()
    with state.use("reference") as model:
        v_ref = policy.velocity(x_t, t, cond, transformer=model).float()
    with state.use("theta") as model:
        v_theta = policy.velocity(x_t, t, cond, transformer=model).float()
        nft_loss(v_theta, v_old, v_ref, x_t, x0, t, advantages, kl_weight=0.1).backward()
    grads = {name: param.grad.detach().clone() for name, param in state.theta_parameters().items()}
    assert all(g is not None for g in grads.values())
    return grads


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_checkpointing_gives_the_same_gradients(sd3, mode):
    plain, checkpointed = _state(sd3, mode, False), _state(sd3, mode, True)
    assert checkpointed.transformer.gradient_checkpointing is True
    assert plain.transformer.gradient_checkpointing is False
    if mode == "full":  # only θ is checkpointed: θ_old and the reference run under no_grad
        assert checkpointed.old_model.gradient_checkpointing is False
    # The checkpointed path is really taken: count the blocks diffusers routes through it.
    calls = []
    original: Callable = checkpointed.transformer._gradient_checkpointing_func

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    checkpointed.transformer._gradient_checkpointing_func = counting
    expected, got = _nft_gradients(sd3, plain), _nft_gradients(sd3, checkpointed)
    assert len(calls) == len(checkpointed.transformer.transformer_blocks)  # θ's forward only
    assert expected.keys() == got.keys()
    assert any(bool(g.abs().max() > 0) for g in expected.values())
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)


def test_checkpointing_backward_refuses_another_lora_view(sd3):
    state = _state(sd3, "lora", True)
    x = torch.randn(1, *sd3.latent_shape)
    cond = {k: v.clone() for k, v in sd3.encode(PROMPTS[:1]).items()}
    loss = sd3.velocity(x, torch.tensor([0.5]), cond, transformer=state.transformer).square().mean()
    with state.use("old"), pytest.raises(RuntimeError, match="gradient checkpointing"):
        state.step(loss)


def test_checkpointing_needs_a_model_that_supports_it():
    with pytest.raises(TypeError, match="gradient checkpointing"):
        TrainingState(nn.Linear(4, 4), TrainingConfig(mode="full", gradient_checkpointing=True))


# ---- text encoders offloaded -----------------------------------------------------------------------


def test_text_encoders_visit_the_device_only_to_encode(sd3_folder, sd3, monkeypatch):
    policy = load_policy(sd3_folder, offload_text_encoders=True)
    assert sorted(policy.text_encoders) == ["text_encoder", "text_encoder_2", "text_encoder_3"]
    assert policy.text_encoder_home == torch.device("cpu")
    moves: dict[str, list[torch.device]] = {name: [] for name in policy.text_encoders}
    for name, encoder in policy.text_encoders.items():
        def spy(*args, _name=name, _to=encoder.to, **kwargs):
            moves[_name].append(torch.device(args[0] if args else kwargs["device"]))
            return _to(*args, **kwargs)

        monkeypatch.setattr(encoder, "to", spy)

    cond = policy.encode(PROMPTS)
    # Each encoder went to the policy's device for the missing prompts, then home to the CPU.
    assert all(m == [policy.device, torch.device("cpu")] for m in moves.values()), moves
    assert all(p.device.type == "cpu" for e in policy.text_encoders.values() for p in e.parameters())
    expected = sd3.encode(PROMPTS)
    assert cond.keys() == expected.keys()
    for key in expected:
        assert torch.equal(cond[key], expected[key]), key
    policy.encode(PROMPTS[:2])  # all cached: nothing moves
    assert all(len(m) == 2 for m in moves.values())
    policy.encode(["a third prompt"])
    assert all(len(m) == 4 for m in moves.values())


def test_without_offload_nothing_moves(sd3, monkeypatch):
    moved = []
    encoder = sd3.text_encoders["text_encoder"]
    monkeypatch.setattr(encoder, "to", lambda *a, **k: moved.append(a) or encoder)
    sd3.encode(["a prompt never encoded before"])
    assert moved == [] and sd3.text_encoder_home == sd3.device


# ---- sequential decode -----------------------------------------------------------------------------


def test_sequential_decode_gives_the_same_images(sd3_folder, sd3, monkeypatch):
    policy = load_policy(sd3_folder, sequential_decode=True)
    latents = torch.randn(3, *sd3.latent_shape, generator=torch.Generator().manual_seed(3))
    batches = []
    vae = policy.components["vae"]
    decode = vae.decode
    monkeypatch.setattr(vae, "decode", lambda z, **k: batches.append(z.shape[0]) or decode(z, **k))
    images = policy.decode(latents)
    assert batches == [1, 1, 1]
    # Bit for bit what the plain policy gives each latent alone; the batched decode differs only by
    # the CPU kernels' batch-size-dependent rounding (measured: under 2e-6 on images in [0, 1]).
    alone = torch.cat([sd3.decode(latents[i : i + 1]) for i in range(3)])
    assert torch.equal(images, alone)
    expected = sd3.decode(latents)
    assert images.shape == expected.shape == (3, 3, *images.shape[2:])
    torch.testing.assert_close(images, expected, atol=1e-5, rtol=0)
    assert torch.equal(policy.decode(latents[:1]), sd3.decode(latents[:1]))


# ---- wiring ----------------------------------------------------------------------------------------


def test_the_options_are_off_by_default_and_set_from_the_command_line(sd3_folder):
    default = load_config(None, [])
    assert not (default.training.gradient_checkpointing or default.model.offload_text_encoders
                or default.model.sequential_decode)
    config = load_config(None, ["training.gradient_checkpointing=true", "model.offload_text_encoders=true",
                                "model.sequential_decode=true"])
    assert config.training.gradient_checkpointing and config.model.offload_text_encoders
    assert config.model.sequential_decode
    policy = load_policy_from_config(ModelConfig(path=str(sd3_folder), device="cpu", offload_text_encoders=True,
                                                 sequential_decode=True))
    assert policy.offload_text_encoders and policy.sequential_decode
