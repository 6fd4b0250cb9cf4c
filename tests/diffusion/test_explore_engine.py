"""The explore engine: its plan, one entry point for every backend, and TE's autocast entered by the
engine itself (issue 1.1: no caller entered it, so TE engines silently ran BF16 GEMMs).

Transformer Engine cannot run here (no CUDA), so the TE tests install a stand-in for
``transformer_engine.pytorch``: a ``Linear`` that records whether the stand-in's autocast is active
at each call, and that autocast. The Blackwell check is bypassed only by naming the backend directly.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from engines import quantize, quantized_layer_names, runtime_backend
from torch import nn

from diffusion.config import ExploreConfig
from diffusion.explore import ExploreEngine, ExplorePlan, explore_plan
from diffusion.quant import (
    DeviceFacts,
    build_engine,
    eligible_linear_names,
    engine_layers,
    load_weights,
    nvfp4_fake_quant,
    te_available,
    te_backend,
)

needs_no_te = pytest.mark.skipif(te_available(), reason="installs a stand-in for the absent Transformer Engine")


class FakeTE:
    """The stand-in ``transformer_engine`` modules and a record of autocast depth."""

    def __init__(self) -> None:
        self.depth = 0
        self.pytorch = types.ModuleType("transformer_engine.pytorch")
        self.recipe = types.ModuleType("transformer_engine.common.recipe")
        fake = self

        class NVFP4BlockScaling:
            pass

        class Linear(nn.Linear):
            def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                         params_dtype: torch.dtype | None = None, device: torch.device | None = None) -> None:
                super().__init__(in_features, out_features, bias=bias, dtype=params_dtype, device=device)
                self.in_autocast: list[bool] = []

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                self.in_autocast.append(fake.depth > 0)
                return super().forward(x)

        Linear.__module__ = "transformer_engine.pytorch"

        @contextlib.contextmanager
        def autocast(enabled: bool = True, recipe: object = None) -> Iterator[None]:
            assert enabled and isinstance(recipe, NVFP4BlockScaling)
            fake.depth += 1
            try:
                yield
            finally:
                fake.depth -= 1

        self.pytorch.Linear = Linear
        self.pytorch.autocast = autocast
        self.recipe.NVFP4BlockScaling = NVFP4BlockScaling


@pytest.fixture
def fake_te(monkeypatch: pytest.MonkeyPatch) -> FakeTE:
    fake = FakeTE()
    package = types.ModuleType("transformer_engine")
    common = types.ModuleType("transformer_engine.common")
    package.pytorch, package.common, common.recipe = fake.pytorch, common, fake.recipe
    for name, module in [("transformer_engine", package), ("transformer_engine.pytorch", fake.pytorch),
                         ("transformer_engine.common", common), ("transformer_engine.common.recipe", fake.recipe)]:
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(te_backend, "_te_pytorch", lambda: fake.pytorch)
    return fake


class Tiny(nn.Module):
    """Linears and a 1×1 conv; ``small`` (32 → 8) has a dim TE cannot run."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.proj = nn.Linear(32, 64)
            self.conv = nn.Conv2d(64, 32, 1)
            self.small = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, 16 pixels, 32]
        h = self.proj(x).transpose(1, 2).reshape(x.shape[0], 64, 4, 4)
        return self.small(self.conv(h).flatten(2).transpose(1, 2))


def te_layers(engine: nn.Module, fake: FakeTE) -> dict[str, nn.Module]:
    return {name: m for name, m in engine.named_modules() if isinstance(m, fake.pytorch.Linear)}


@needs_no_te
def test_a_te_engine_runs_every_te_layer_inside_the_fp4_autocast_by_itself(fake_te: FakeTE) -> None:
    model = Tiny()
    layers = engine_layers(model, "te", conv1x1=True)
    assert layers.linears == ("proj",) and layers.convs == ("conv",)  # small: 8 is not a multiple of 16
    engine = build_engine(model, "nvfp4", "te", linears=layers.linears, convs=layers.convs)
    assert set(te_layers(engine, fake_te)) == {"proj", "conv"} and quantized_layer_names(engine) == ["proj", "conv"]
    assert runtime_backend(engine) == "te"
    # Keys and shapes of the high-precision model: the conv's TE weight shows as [out, in, 1, 1].
    assert {k: v.shape for k, v in engine.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}

    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        out = engine(x)  # no context entered here
        torch.testing.assert_close(out, model(x))  # the stand-in computes in full precision
    assert fake_te.depth == 0
    assert {name: layer.in_autocast for name, layer in te_layers(engine, fake_te).items()} == {
        "proj": [True], "conv": [True]
    }

    # New weights reach TE's parameters through the conv's 4-D view.
    new = Tiny()
    with torch.no_grad():
        for p in new.parameters():
            p.mul_(0.5)
    load_weights(engine, new.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(engine(x), new(x))
    assert all(layer.in_autocast == [True, True] for layer in te_layers(engine, fake_te).values())
    engine.load_state_dict(model.state_dict())  # torch's own loading takes the 4-D conv weight too
    assert torch.equal(engine.conv.weight, model.conv.weight.reshape(32, 64))


def sd3_inputs(policy) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    config = policy.transformer.config
    side = config.sample_size
    return {
        "hidden_states": torch.randn(2, config.in_channels, side, side, generator=g),
        "timestep": torch.tensor([300.0, 700.0]),
        "encoder_hidden_states": torch.randn(2, 5, config.joint_attention_dim, generator=g),
        "pooled_projections": torch.randn(2, config.pooled_projection_dim, generator=g),
        "return_dict": False,
    }


@needs_no_te
def test_explore_engine_on_te_enters_the_autocast(embedded_policy, fake_te: FakeTE, monkeypatch) -> None:
    blackwell = DeviceFacts((10, 0), te=True, torchao=True)
    monkeypatch.setattr("diffusion.explore.device_facts", lambda device: blackwell)
    engine = ExploreEngine(embedded_policy, ExploreConfig(precision="auto", min_dim=64))
    ff = tuple(f"transformer_blocks.{i}.ff.{layer}" for i in range(4) for layer in ("net.0.proj", "net.2"))
    assert engine.plan == ExplorePlan("nvfp4", "te", ff, (), tuple(f"{name}.weight" for name in ff),
                                      emulated=False, summary=engine.plan.summary)
    assert "real NVFP4 GEMMs on sm_100" in engine.plan.summary
    with torch.no_grad():
        engine.module(**sd3_inputs(embedded_policy))
    calls = {name: layer.in_autocast for name, layer in te_layers(engine.module, fake_te).items()}
    assert calls == {name: [True] for name in ff}


class HandQuantLinear(nn.Module):
    """W4A4 NVFP4 written out: F.linear(nvfp4(x), nvfp4(W), b)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight_fq = nvfp4_fake_quant(linear.weight.detach())
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(nvfp4_fake_quant(x), self.weight_fq, self.bias)


def test_project_engine_equals_the_quantized_model_and_the_hand_computation(embedded_policy) -> None:
    config = ExploreConfig(precision="nvfp4", backend="project", allow_emulation=True, min_dim=64)
    engine = ExploreEngine(embedded_policy, config)
    transformer = embedded_policy.transformer
    skip = embedded_policy.family.quant.skip
    assert engine.plan.linears == tuple(eligible_linear_names(transformer, skip=skip, min_dim=64))
    assert engine.plan.backend == "project" and runtime_backend(engine.module) == "project"
    assert quantized_layer_names(engine.module) == list(engine.plan.layers)
    assert list(engine.module.state_dict()) == list(transformer.state_dict())

    hand = quantize(transformer, "none")
    for name in engine.plan.linears:
        hand.set_submodule(name, HandQuantLinear(hand.get_submodule(name)))
    inputs = sd3_inputs(embedded_policy)
    with torch.no_grad():
        out = engine.module(**inputs)[0]
        assert torch.equal(out, quantize(transformer, "nvfp4", skip=skip, min_dim=64, backend="project")(
            **inputs)[0])
        assert torch.equal(out, hand(**inputs)[0])
        assert not torch.equal(out, transformer(**inputs)[0])


def test_plan_follows_the_family_unless_the_config_overrides(embedded_policy) -> None:
    transformer = embedded_policy.transformer
    family = explore_plan(embedded_policy, ExploreConfig(precision="nvfp4", backend="project", allow_emulation=True))
    # SD3's 2432 leaves nothing this small
    assert family == ExplorePlan("nvfp4", "project", (), (), (), emulated=True, summary=family.summary)
    plan = explore_plan(embedded_policy, ExploreConfig(precision="fp8", backend="project", allow_emulation=True,
                                                       min_dim=0, skip=["attn"]))
    assert plan.linears == tuple(eligible_linear_names(transformer, skip=["attn"], min_dim=0))
    assert plan.quantized_weights == ()  # FP8 weights travel dense
    w4a16 = explore_plan(embedded_policy, ExploreConfig(precision="nvfp4_w4a16", backend="project",
                                                        allow_emulation=True, min_dim=64))
    assert w4a16.quantized_weights == tuple(f"{name}.weight" for name in w4a16.linears) and w4a16.linears


def test_an_fp8_candidate_gets_the_same_proxy_in_any_batch(embedded_policy) -> None:
    """Explored in one batch of four, candidate 0's low-precision sample is bitwise the same beside three other
    candidates under `fp8` (per-row scales); under `fp8_tensor` the batch's shared activation scale moves it."""
    from diffusion.noise import candidate_seeds

    prompts, seeds = ["a handwritten digit seven"] * 4, candidate_seeds(0, 0, 0, 8)
    for precision in ("fp8", "fp8_tensor"):
        engine = ExploreEngine(embedded_policy, ExploreConfig(precision=precision, backend="project",
                                                              allow_emulation=True, min_dim=0))
        assert engine.plan.linears
        first = embedded_policy.sample(prompts, seeds[:4], steps=3, transformer=engine.module, batch_size=4).x0
        other = embedded_policy.sample(prompts, [seeds[0], *seeds[5:8]], steps=3, transformer=engine.module,
                                       batch_size=4).x0
        assert torch.equal(first[0], other[0]) == (precision == "fp8"), precision


def test_precision_none_is_a_plain_copy(embedded_policy) -> None:
    engine = ExploreEngine(embedded_policy, ExploreConfig(precision="none"))
    bf16 = "BF16 exploration (a full-precision copy) on CPU"
    assert engine.plan == ExplorePlan("none", "none", (), (), (), summary=bf16)
    assert engine.module is not embedded_policy.transformer and runtime_backend(engine.module) is None
    inputs = sd3_inputs(embedded_policy)
    with torch.no_grad():
        assert torch.equal(engine.module(**inputs)[0], embedded_policy.transformer(**inputs)[0])


def test_load_refreshes_the_quantizers(embedded_policy) -> None:
    config = ExploreConfig(precision="nvfp4", backend="project", allow_emulation=True, min_dim=64)
    engine = ExploreEngine(embedded_policy, config)
    transformer = embedded_policy.transformer
    new = {key: value * 1.25 for key, value in transformer.state_dict().items()}
    engine.load(new)
    fresh = quantize(transformer, "none")
    fresh.load_state_dict(new)
    expected = quantize(fresh, "nvfp4", skip=embedded_policy.family.quant.skip, min_dim=64)
    inputs = sd3_inputs(embedded_policy)
    with torch.no_grad():
        assert torch.equal(engine.module(**inputs)[0], expected(**inputs)[0])
    with pytest.raises(KeyError, match="lacks"):
        engine.load({"proj_out.bias": new["proj_out.bias"]})
    engine.load({"proj_out.bias": new["proj_out.bias"]}, strict=False)


def held_bytes(modules) -> int:
    """Bytes of the distinct storages behind the modules' parameters and buffers (shared ones once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for m in modules for t in (*m.parameters(), *m.buffers())}
    return sum(storages.values())


@pytest.mark.parametrize("precision", ["nvfp4", "none"])
@pytest.mark.parametrize("family", ["embedded", "sd3", "flux", "sana"])
def test_an_engine_built_in_place_is_the_policys_transformer_and_samples_as_the_copy(family, precision,
                                                                                     tiny_folder) -> None:
    """The explorer's arrangement: the engine quantizes the policy's own transformer, taking over its
    Parameters, and the policy holds exactly one transformer fewer than with the copy, sampling bitwise
    the same."""
    from diffusion.config import EMBEDDED_MODEL
    from diffusion.embedded.data import prompt_for
    from diffusion.loading import load_policy
    from diffusion.noise import candidate_seeds

    folder, resolution = (EMBEDDED_MODEL, None) if family == "embedded" else (tiny_folder(family), 16)
    config = ExploreConfig(precision=precision, backend="project", allow_emulation=True, min_dim=0)
    copied_policy = load_policy(folder, resolution=resolution)
    copied = ExploreEngine(copied_policy, config)
    policy = load_policy(folder, resolution=resolution)
    weights = {p.data_ptr() for p in policy.transformer.parameters()}
    engine = ExploreEngine(policy, config, in_place=True)

    assert policy.transformer is engine.module and policy.components["transformer"] is engine.module
    assert {p.data_ptr() for p in engine.module.parameters()} == weights  # taken over, not copied
    before = held_bytes([m for m in (*copied_policy.components.values(), copied.module) if isinstance(m, nn.Module)])
    after = held_bytes([m for m in policy.components.values() if isinstance(m, nn.Module)])
    assert before - after == held_bytes([copied_policy.transformer])
    prompts = ([prompt_for(3), prompt_for(7)] if family == "embedded"
               else ["a photo of a red cat", "a sign that says seven"])
    seeds = candidate_seeds(0, 0, 0, len(prompts))
    assert torch.equal(policy.sample(prompts, seeds, steps=2, transformer=engine.module).x0,
                       copied_policy.sample(prompts, seeds, steps=2, transformer=copied.module).x0)
