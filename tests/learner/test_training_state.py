"""TrainingState (θ, θ_old, reference, AdamW) and its checkpoints, on the real tiny model with real peft."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from engines import quantize

from diffusion.config import EMBEDDED_MODEL
from diffusion.loading import load_policy
from diffusion.quant import load_weights
from learner.checkpoint import save_checkpoint
from learner.checkpoint_load import load_checkpoint
from learner.config import TrainingConfig
from learner.training_state import TrainingState

BATCH = 2


@pytest.fixture(scope="module")
def base():
    """A pristine policy; its transformer is only ever deep-copied, never trained."""
    return load_policy(EMBEDDED_MODEL)


@pytest.fixture(scope="module")
def cond(base):
    encoded = base.encode(["a red square", "a blue circle"])
    return {k: v.clone() for k, v in encoded.items()}


def make_state(base, mode="lora", rank=4, seed=0, **kwargs) -> TrainingState:
    config = TrainingConfig(mode=mode, lora_rank=rank, lora_alpha=2 * rank, **kwargs)
    return TrainingState(copy.deepcopy(base.transformer), config, family_targets=base.family.lora_targets, seed=seed)


def draw(base, generator=None):
    """Inputs of one training step: x_σ, σ and a velocity target."""
    x = torch.randn(BATCH, *base.latent_shape, generator=generator)
    sigma = torch.rand(BATCH, generator=generator)
    target = torch.randn(BATCH, *base.latent_shape, generator=generator)
    return x, sigma, target


def velocity(base, model, cond, x, sigma):
    return base.velocity(x, sigma, cond, transformer=model)


def loss_of(state, base, cond, batch):
    x, sigma, target = batch
    with state.use("theta") as model:
        return torch.nn.functional.mse_loss(velocity(base, model, cond, x, sigma), target)


def views(state, base, cond, batch):
    x, sigma, _ = batch
    out = {}
    for view in ("theta", "old", "reference"):
        with torch.no_grad(), state.use(view) as model:
            out[view] = velocity(base, model, cond, x, sigma)
    return out


def snapshot(params):
    return {k: v.detach().clone() for k, v in params.items()}


def fixed_batch(base):
    return draw(base, torch.Generator().manual_seed(7))


# ---- LoRA views ----------------------------------------------------------------------------------
def test_lora_starts_equal_to_base(base, cond):
    before = torch.get_rng_state()
    state = make_state(base)
    assert torch.equal(torch.get_rng_state(), before), "building the state must not consume the global RNG"
    theta, old = state.theta_parameters(), state.old_parameters()
    assert theta.keys() == old.keys() and len(theta) > 0
    assert all(".lora_A." in k or ".lora_B." in k for k in theta)
    for name in theta:
        assert torch.equal(theta[name], old[name])
        if ".lora_B." in name:
            assert not theta[name].any()
    trainable = {id(p) for p in state.transformer.parameters() if p.requires_grad}
    assert trainable == {id(p) for p in theta.values()}

    batch = fixed_batch(base)
    with torch.no_grad():
        expected = velocity(base, base.transformer, cond, *batch[:2])
    for view, value in views(state, base, cond, batch).items():
        assert torch.allclose(value, expected, atol=1e-6, rtol=0), view

    same = make_state(base, seed=0).theta_parameters()
    other = make_state(base, seed=1).theta_parameters()
    a_keys = [k for k in theta if ".lora_A." in k]
    assert all(torch.equal(theta[k], same[k]) for k in a_keys)
    assert not all(torch.equal(theta[k], other[k]) for k in a_keys)


@pytest.mark.parametrize("init", ["gaussian", "kaiming"])
def test_lora_a_is_drawn_as_configured(base, init):
    """gaussian (every official config: peft's init_lora_weights="gaussian") draws A ~ N(0, (1/r)²); kaiming (peft's
    default) draws kaiming-uniform(a=√5): bound 1/√fan_in, std 1/√(3·fan_in). The embedded model's Linears have
    fan_in 64, so at rank 4 the two spreads are 0.25 and 0.072."""
    from typing import get_args

    from learner.config import LoraInit
    from learner.lora_adapters import LORA_INITS

    assert sorted(LORA_INITS) == sorted(get_args(LoraInit))
    state = make_state(base, rank=4, lora_init=init)
    a = [v.detach() for k, v in state.theta_parameters().items() if ".lora_A." in k]
    assert {t.shape[1] for t in a} == {64}
    pooled = torch.cat([t.flatten() for t in a])  # 31 layers × 4 × 64 = 7936 draws
    expected = 1 / 4 if init == "gaussian" else 1 / math.sqrt(3 * 64)
    assert float(pooled.std()) == pytest.approx(expected, rel=0.03)
    assert abs(float(pooled.mean())) < 0.01
    if init == "kaiming":
        assert float(pooled.abs().max()) <= 1 / math.sqrt(64)
    else:
        assert float(pooled.abs().max()) > 3 / 4  # past any kaiming bound here: a normal's tail


def test_step_changes_theta_only(base, cond):
    state = make_state(base)
    batch = fixed_batch(base)
    before = views(state, base, cond, batch)
    theta0, old0 = snapshot(state.theta_parameters()), snapshot(state.old_parameters())
    flags = {id(p): p.requires_grad for p in state.transformer.parameters()}

    norm = state.step(loss_of(state, base, cond, draw(base)))
    assert math.isfinite(norm) and norm > 0
    assert state.skipped_steps == 0
    assert all(p.grad is None for p in state.theta_parameters().values())
    assert {id(p): p.requires_grad for p in state.transformer.parameters()} == flags, "switching views kept grads"

    theta1, old1 = state.theta_parameters(), state.old_parameters()
    assert any(not torch.equal(theta1[k], theta0[k]) for k in theta0)
    assert all(torch.equal(old1[k], old0[k]) for k in old0)
    after = views(state, base, cond, batch)
    assert not torch.allclose(after["theta"], before["theta"])
    assert torch.equal(after["old"], before["old"])
    assert torch.equal(after["reference"], before["reference"])


def test_use_switches_and_restores(base):
    state = make_state(base)
    assert state.view == "theta"
    with state.use("reference") as model:
        assert model is state.transformer and state.view == "reference"
        assert not torch.is_grad_enabled()
        with state.use("old"):
            assert state.view == "old"
        assert state.view == "reference"
    assert state.view == "theta" and torch.is_grad_enabled()
    with pytest.raises(RuntimeError), state.use("old"):
        raise RuntimeError("boom")
    assert state.view == "theta"
    with pytest.raises(ValueError, match="unknown view"), state.use("ema"):  # type: ignore[arg-type]
        pass
    with state.autocast():
        assert not torch.is_autocast_enabled("cpu")


def test_soft_update(base, cond):
    state = make_state(base)
    for _ in range(2):
        state.step(loss_of(state, base, cond, draw(base)))
    theta, old = state.theta_parameters(), state.old_parameters()
    old0 = snapshot(old)

    state.soft_update(1.0)
    assert all(torch.equal(old[k], old0[k]) for k in old)
    state.soft_update(0.5)
    assert all(torch.equal(old[k], (old0[k] + theta[k]) / 2) for k in old)
    assert any(not torch.equal(old[k], old0[k]) for k in old)
    state.soft_update(0.0)
    assert all(torch.equal(old[k], theta[k]) for k in old)
    out = views(state, base, cond, fixed_batch(base))
    assert torch.equal(out["old"], out["theta"])
    with pytest.raises(ValueError):
        state.soft_update(1.5)


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_sampling_weights_match_old_view(base, cond, mode):
    state = make_state(base, mode=mode)
    for _ in range(2):
        state.step(loss_of(state, base, cond, draw(base)))
        state.soft_update(0.5)
    weights = state.sampling_weights()
    reference = base.transformer.state_dict()
    assert list(weights) == list(reference)
    assert all(weights[k].shape == reference[k].shape and weights[k].dtype == reference[k].dtype for k in weights)

    engine = quantize(base.transformer, "none")  # the explorer's engine, loaded as explorers do
    load_weights(engine, weights)
    batch = fixed_batch(base)
    with torch.no_grad():
        loaded = velocity(base, engine, cond, *batch[:2])
        untouched = velocity(base, base.transformer, cond, *batch[:2])
    old = views(state, base, cond, batch)["old"]
    assert torch.allclose(loaded, old, atol=1e-5, rtol=0)
    assert not torch.allclose(loaded, untouched, atol=1e-5, rtol=0), "θ_old should have moved off the base"


# ---- the update ----------------------------------------------------------------------------------
def test_step_clips_like_torch(base, cond):
    clip = 1e-3
    state = make_state(base, grad_clip=clip)
    twin = make_state(base, grad_clip=clip)
    batch = draw(base)
    norm = state.step(loss_of(state, base, cond, batch))

    params = list(twin.theta_parameters().values())
    loss_of(twin, base, cond, batch).backward()
    raw = [p.grad.clone() for p in params]
    expected = torch.nn.utils.clip_grad_norm_(params, clip)
    assert norm == float(expected) and norm > clip
    independent = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in raw]))
    assert math.isclose(norm, float(independent), rel_tol=1e-5)
    clipped = [p.grad.clone() for p in params]
    manual = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-8)
    manual.step()
    for p, q in zip(state.theta_parameters().values(), params, strict=True):
        assert torch.equal(p, q)
    beta1 = 0.9
    for p, g_clip, g_raw in zip(state.theta_parameters().values(), clipped, raw, strict=True):
        exp_avg = state.optimizer.state[p]["exp_avg"]
        assert torch.allclose(exp_avg, (1 - beta1) * g_clip, rtol=1e-6, atol=0)
        if g_raw.any():
            assert not torch.allclose(exp_avg, (1 - beta1) * g_raw, rtol=1e-3, atol=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_loss_is_skipped(base, cond, bad):
    state = make_state(base)
    theta0 = snapshot(state.theta_parameters())
    norm = state.step(loss_of(state, base, cond, draw(base)) * bad)
    assert not math.isfinite(norm)
    assert state.skipped_steps == 1
    assert all(torch.equal(p, theta0[k]) for k, p in state.theta_parameters().items())
    assert all(p.grad is None for p in state.theta_parameters().values())
    assert not state.optimizer.state
    assert math.isfinite(state.step(loss_of(state, base, cond, draw(base))))
    assert state.skipped_steps == 1


# ---- full mode -----------------------------------------------------------------------------------
def test_full_mode_views(base, cond):
    state = make_state(base, mode="full")
    assert all(p.requires_grad for p in state.transformer.parameters())
    assert state.theta_parameters().keys() == dict(base.transformer.named_parameters()).keys()
    with state.use("old") as old_model, state.use("reference") as ref_model:
        assert old_model is not state.transformer and ref_model is not state.transformer
        assert not any(p.requires_grad for p in (*old_model.parameters(), *ref_model.parameters()))
    batch = fixed_batch(base)
    before = views(state, base, cond, batch)
    assert torch.equal(before["theta"], before["old"]) and torch.equal(before["theta"], before["reference"])
    old0 = snapshot(state.old_parameters())

    assert math.isfinite(state.step(loss_of(state, base, cond, draw(base))))
    after = views(state, base, cond, batch)
    assert not torch.allclose(after["theta"], before["theta"])
    assert torch.equal(after["old"], before["old"]) and torch.equal(after["reference"], before["reference"])
    assert all(torch.equal(p, old0[k]) for k, p in state.old_parameters().items())

    state.soft_update(0.0)
    theta, old = state.theta_parameters(), state.old_parameters()
    assert all(torch.equal(old[k], theta[k]) for k in old)
    assert torch.equal(views(state, base, cond, batch)["old"], after["theta"])


# ---- checkpoints ---------------------------------------------------------------------------------
def train_step(state, base, cond):
    """One step of a toy NFT-like loop: inputs from the global RNG, a θ_old forward, soft update."""
    x, sigma, target = draw(base)
    with state.use("old") as model:
        v_old = velocity(base, model, cond, x, sigma)
    with state.use("theta") as model:
        v = velocity(base, model, cond, x, sigma)
    loss = torch.nn.functional.mse_loss(v, target) + 0.1 * torch.nn.functional.mse_loss(v, v_old)
    state.step(loss)
    state.soft_update(0.9)


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_resume_is_bitwise(base, cond, tmp_path, mode):
    torch.manual_seed(1234)
    run = make_state(base, mode=mode)
    train_step(run, base, cond)
    run.skipped_steps = 3  # travels with the checkpoint
    save_checkpoint(tmp_path / "ckpt", run, iteration=1, extra={"samples_seen": 16, "note": "x"})
    train_step(run, base, cond)
    train_step(run, base, cond)
    rng_after = torch.get_rng_state()

    torch.manual_seed(999)  # a different RNG state and init: the checkpoint must restore both
    resumed = make_state(base, mode=mode, seed=5)
    info = load_checkpoint(tmp_path / "ckpt", resumed)
    assert info == {"iteration": 1, "extra": {"samples_seen": 16, "note": "x"}}
    assert resumed.skipped_steps == 3
    train_step(resumed, base, cond)
    train_step(resumed, base, cond)

    for a, b in ((run.theta_parameters(), resumed.theta_parameters()),
                 (run.old_parameters(), resumed.old_parameters())):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
    theta_a, theta_b = run.theta_parameters(), resumed.theta_parameters()
    assert len(run.optimizer.state) == len(resumed.optimizer.state) > 0
    for k in theta_a:
        sa, sb = run.optimizer.state.get(theta_a[k], {}), resumed.optimizer.state.get(theta_b[k], {})
        assert sa.keys() == sb.keys()
        for key in sa:
            assert torch.equal(sa[key], sb[key]), (k, key)
    assert torch.equal(torch.get_rng_state(), rng_after)


def test_checkpoint_files_and_overwrite(base, cond, tmp_path):
    state = make_state(base)
    train_step(state, base, cond)
    target = tmp_path / "ckpt"
    save_checkpoint(target, state, iteration=1, extra={})
    save_checkpoint(target, state, iteration=2, extra={"a": [1, 2]})  # replaces the first one, kept beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "ckpt.previous"]
    assert json.loads((tmp_path / "ckpt.previous" / "meta.json").read_text())["iteration"] == 1
    files = list(target.rglob("*"))
    assert files and all(p.is_file() and p.suffix in {".safetensors", ".json"} for p in files)
    meta = json.loads((target / "meta.json").read_text())
    assert meta["iteration"] == 2 and meta["mode"] == "lora"
    assert load_checkpoint(target, state)["extra"] == {"a": [1, 2]}
    with pytest.raises(TypeError, match="JSON"):
        save_checkpoint(tmp_path / "bad", state, iteration=0, extra={"x": object()})
    assert not (tmp_path / "bad").exists()
    with pytest.raises(FileNotFoundError, match=r"meta\.json"):
        load_checkpoint(tmp_path / "missing", state)


def test_checkpoint_refuses_other_rank_and_mode(base, cond, tmp_path):
    state = make_state(base, rank=4)
    save_checkpoint(tmp_path / "ckpt", state, iteration=0, extra={})
    other = make_state(base, rank=8)
    theta0 = snapshot(other.theta_parameters())
    with pytest.raises(ValueError, match=r"transformer_blocks\.\d+\.attn\.\w+(\.0)?\.lora_[AB]\.weight.*shape"):
        load_checkpoint(tmp_path / "ckpt", other)
    assert all(torch.equal(p, theta0[k]) for k, p in other.theta_parameters().items()), "unchanged on failure"

    fewer = make_state(base, lora_targets=["attn.to_q"])
    with pytest.raises(ValueError, match=r"unexpected 'transformer_blocks\.\d+\.attn\."):
        load_checkpoint(tmp_path / "ckpt", fewer)
    with pytest.raises(ValueError, match="mode"):
        load_checkpoint(tmp_path / "ckpt", make_state(base, mode="full"))


def test_interrupted_save_still_loads(base, cond, tmp_path):
    state = make_state(base)
    target = tmp_path / "ckpt"
    save_checkpoint(target, state, iteration=1, extra={})
    # Died between the renames: the old checkpoint is at ckpt.previous, the new complete one at ckpt.tmp.
    target.rename(tmp_path / "ckpt.previous")
    save_checkpoint(tmp_path / "other", state, iteration=2, extra={})
    (tmp_path / "other").rename(tmp_path / "ckpt.tmp")
    with pytest.warns(UserWarning, match="interrupted"):
        assert load_checkpoint(target, state)["iteration"] == 2
    # Died while writing ckpt.tmp (no meta.json yet): the previous one is used.
    (tmp_path / "ckpt.tmp" / "meta.json").unlink()
    with pytest.warns(UserWarning, match="interrupted"):
        assert load_checkpoint(target, state)["iteration"] == 1
    save_checkpoint(target, state, iteration=3, extra={})  # the next save cleans up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "ckpt.previous"]
    assert load_checkpoint(target, state)["iteration"] == 3
