"""Real FP8 exploration (issue 26): the choice of engine per GPU generation, and the torchao backend.

torchao's ``Float8Tensor`` and ``torch._scaled_mm`` have reference kernels on the CPU, so the real library
runs here, not a stand-in: the FP8 codes and scales are checked against the project's ``fp8`` numerics, the
refresh after a weight load against a fresh engine, and a compiled engine for the absence of recompiles.
Only the speed needs the GPU (``bench.gpu_check``).
"""

from __future__ import annotations

import pytest
import torch
from engines import quantize, quantized_layer_names, runtime_backend
from torch import nn

from diffusion.quant import (
    DeviceFacts,
    Float8Conv1x1,
    Float8Linear,
    QuantLinear,
    choose_engine,
    fp8_fake_quant,
    load_weights,
)

BLACKWELL = DeviceFacts((10, 0), te=True, torchao=True)
BLACKWELL_NO_TE = DeviceFacts((10, 0), te=False, torchao=True)
HOPPER = DeviceFacts((9, 0), te=False, torchao=True)
ADA = DeviceFacts((8, 9), te=False, torchao=True)
AMPERE = DeviceFacts((8, 0), te=False, torchao=True)
CPU = DeviceFacts(None, te=False, torchao=True)


@pytest.mark.parametrize(
    ("device", "precision", "backend", "emulated"),
    [
        (BLACKWELL, "nvfp4", "te", False),
        (BLACKWELL_NO_TE, "fp8", "torchao", False),
        (HOPPER, "fp8", "torchao", False),
        (ADA, "fp8", "torchao", False),
        (AMPERE, "none", "none", False),
        (DeviceFacts((9, 0), torchao=False), "none", "none", False),
        (CPU, "nvfp4", "project", True),
    ],
)
def test_auto_picks_the_fastest_honest_engine(device, precision, backend, emulated) -> None:
    choice = choose_engine("auto", "auto", device)
    assert (choice.precision, choice.backend, choice.emulated) == (precision, backend, emulated)
    assert choice.summary.startswith("auto → ")


def test_auto_says_in_words_what_runs() -> None:
    assert "real FP8 GEMMs on sm_90" in choose_engine("auto", "auto", HOPPER).summary
    assert "real NVFP4 GEMMs on sm_100" in choose_engine("auto", "auto", BLACKWELL).summary
    ampere = choose_engine("auto", "auto", AMPERE).summary
    assert "BF16 exploration (a full-precision copy) on sm_80; no FP8/FP4 tensor cores on sm_80" in ampere
    assert "pip install torchao" in choose_engine("auto", "auto", DeviceFacts((9, 0))).summary
    assert "emulated" in choose_engine("auto", "auto", CPU).summary


def test_an_emulated_request_is_refused_in_one_line_unless_allowed() -> None:
    with pytest.raises(ValueError) as refused:
        choose_engine("nvfp4", "auto", HOPPER)
    message = str(refused.value)
    assert "\n" not in message
    assert "nvfp4 emulated by the modelopt backend's fake quantization on sm_90: exploration will be slower" in message
    assert "fp8 runs real FP8 GEMMs here" in message and "explore.allow_emulation=true" in message
    allowed = choose_engine("nvfp4", "auto", HOPPER, allow_emulation=True)
    assert (allowed.backend, allowed.emulated) == ("modelopt", True)
    for device, precision in [(CPU, "fp8"), (CPU, "nvfp4"), (BLACKWELL, "nvfp4_w4a16"), (ADA, "nvfp4")]:
        with pytest.raises(ValueError, match="allow_emulation"):
            choose_engine(precision, "auto", device)
    with pytest.raises(ValueError, match="without its GPU kernels on CPU"):
        choose_engine("fp8", "torchao", CPU)  # torch._scaled_mm's reference kernel: not faster


def test_explicit_requests_that_run_for_real_need_no_allowance() -> None:
    assert choose_engine("fp8", "auto", HOPPER).backend == "torchao"
    assert choose_engine("fp8", "auto", BLACKWELL).backend == "torchao"
    assert choose_engine("nvfp4", "auto", BLACKWELL).backend == "te"
    assert choose_engine("none", "auto", CPU).precision == "none"
    with pytest.raises(ValueError, match="sm_89 or newer"):
        choose_engine("fp8", "torchao", AMPERE, allow_emulation=True)
    with pytest.raises(ValueError, match="runs only precision='fp8'"):
        choose_engine("nvfp4", "torchao", HOPPER, allow_emulation=True)
    with pytest.raises(ValueError, match="precision=auto chooses the backend too"):
        choose_engine("auto", "project", HOPPER)


def mlp(seed: int = 0) -> nn.Sequential:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        # 48 -> 40: 40 is not a multiple of 16, so torch._scaled_mm cannot take that layer.
        return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 48), nn.GELU(), nn.Linear(48, 40))


def test_torchao_replaces_the_layers_its_gemm_takes_and_keeps_the_state_dict() -> None:
    model = mlp()
    engine = quantize(model, "fp8", backend="torchao")
    assert quantized_layer_names(engine) == ["0", "2"] and type(engine[4]) is nn.Linear
    assert isinstance(engine[0], Float8Linear) and not isinstance(quantize(model, "fp8")[0], Float8Linear)
    assert isinstance(quantize(model, "fp8")[0], QuantLinear)  # auto on CPU: the project's fake quantization
    assert runtime_backend(engine) == "torchao"
    assert list(engine.state_dict()) == list(model.state_dict())
    assert all(torch.equal(engine.state_dict()[k], v) for k, v in model.state_dict().items())


# the amax each FP8 precision scales by: per output channel / per row, or one for the tensor
AMAX = {"fp8": lambda t: t.abs().amax(dim=-1, keepdim=True), "fp8_tensor": lambda t: t.abs().amax()}


@pytest.mark.parametrize("precision", ["fp8", "fp8_tensor"])
def test_torchao_fp8_codes_and_scales_are_the_projects_fp8(precision) -> None:
    """Weight and input are quantized to the codes `fp8_fake_quant` rounds to (E4M3 of x·448/amax) with the
    scale amax/448, amax per output channel and per input row (`fp8`, torchao's PerRow) or per tensor
    (`fp8_tensor`). Dequantized, the two differ by at most two fp32 ulps: torchao multiplies the codes by
    amax/448, the fake quantization by the fp32 reciprocal of 448/amax (modelopt's order). The GEMM then
    accumulates in its own order, so one layer agrees with the fake-quantized one to rounding."""
    amax = AMAX[precision]
    with torch.random.fork_rng():
        torch.manual_seed(15)  # a layer whose dequantized weights show the difference
        layer = quantize(nn.Linear(64, 128), precision, backend="torchao")
    weight = layer.weight.detach()
    codes = (weight * (448 / amax(weight))).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(layer.weight_fq.qdata.view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(layer.weight_fq.scale.reshape(-1), (amax(weight) / 448).reshape(-1))
    assert layer.weight_fq.scale.numel() == (128 if precision == "fp8" else 1)
    dequantized, fake = layer.weight_fq.dequantize(), fp8_fake_quant(weight, amax(weight))
    assert not torch.equal(dequantized, fake)
    torch.testing.assert_close(dequantized, fake, rtol=2**-22, atol=0)  # within two fp32 ulps
    x = torch.randn(3, 77, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = layer(x)
        fake = torch.nn.functional.linear(fp8_fake_quant(x, amax(x)), fp8_fake_quant(weight, amax(weight)),
                                          layer.bias)
    assert out.shape == (3, 77, 128)
    torch.testing.assert_close(out, fake, rtol=1e-5, atol=1e-5)
    assert not torch.equal(out, torch.nn.functional.linear(x, weight, layer.bias))  # it did quantize


@pytest.mark.parametrize("backend", ["project", "torchao"])
def test_a_rows_fp8_result_does_not_depend_on_its_batchmates(backend) -> None:
    """Per-row scaling (`fp8`): a sample's output is the same bit for bit whichever samples share its batch —
    here the second batch holds a sample 100× larger, which moves the per-tensor scale (`fp8_tensor`) of every
    row and so its neighbours' results."""
    rows = torch.randn(4, 77, 64, generator=torch.Generator().manual_seed(5))
    other = torch.cat([rows[:1], 100 * rows[1:]])  # sample 0 with other batchmates
    for precision in ("fp8", "fp8_tensor"):
        layer = quantize(mlp(0), precision, backend=backend)
        with torch.no_grad():
            same = torch.equal(layer(rows)[0], layer(other)[0])
        assert same == (precision == "fp8"), precision


def test_refresh_after_a_load_equals_a_fresh_engine_and_reuses_the_fp8_storage() -> None:
    engine = quantize(mlp(0), "fp8", backend="torchao")
    storage = (engine[0].weight_fq.qdata.data_ptr(), engine[0].weight_fq.scale.data_ptr())
    new = mlp(1)
    load_weights(engine, new.state_dict())
    fresh = quantize(new, "fp8", backend="torchao")
    assert (engine[0].weight_fq.qdata.data_ptr(), engine[0].weight_fq.scale.data_ptr()) == storage
    for name in ("0", "2"):
        assert torch.equal(engine.get_submodule(name).weight_fq.qdata, fresh.get_submodule(name).weight_fq.qdata)
        assert torch.equal(engine.get_submodule(name).weight_fq.scale, fresh.get_submodule(name).weight_fq.scale)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(engine(x), fresh(x))


def test_a_compiled_engine_takes_new_weights_without_recompiling() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    engine = quantize(mlp(0), "fp8", backend="torchao")
    compiled = torch.compile(engine, backend="aot_eager")  # traces the FP8 tensor subclass; no C++ build
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        first = compiled(x)
        graphs = counters["stats"]["unique_graphs"]
        load_weights(engine, mlp(1).state_dict())
        second = compiled(x)
        assert counters["stats"]["unique_graphs"] == graphs  # the refresh wrote into the traced tensors
        assert torch.equal(second, engine(x)) and not torch.equal(first, second)


def test_a_1x1_conv_runs_as_a_real_fp8_linear_over_channels() -> None:
    conv = nn.Conv2d(32, 64, 1)
    engine = quantize(nn.Sequential(conv), "fp8", conv1x1=True, backend="torchao")
    assert isinstance(engine[0], Float8Conv1x1)
    x = torch.randn(2, 32, 4, 4, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        rows, weight, amax = x.flatten(2).transpose(1, 2), conv.weight.reshape(64, 32), AMAX["fp8"]
        fake = torch.nn.functional.linear(fp8_fake_quant(rows, amax(rows)), fp8_fake_quant(weight, amax(weight)),
                                          conv.bias).transpose(1, 2).reshape(2, 64, 4, 4)
        torch.testing.assert_close(engine(x), fake, rtol=1e-5, atol=1e-5)


def test_a_sol_rl_job_exploring_in_torchao_fp8_trains_the_project_fp8_weights(small_trainer) -> None:
    """Same FP8 codes, so the same ranking: the seeds kept, the regeneration in full precision and hence the
    trained weights are identical to those of the project backend's FP8 (fake-quantized) exploration."""
    runs = {}
    for backend in ("torchao", "project"):
        trainer = small_trainer("explore.precision=fp8", f"explore.backend={backend}", "explore.allow_emulation=true")
        assert trainer.explore_plan.backend == backend and trainer.explore_plan.linears
        selected = []
        for iteration in range(2):
            metrics = trainer.train_iteration(iteration).metrics()
            selected.append(metrics["reward_mean"])
            assert metrics["explore_step_s"] > 0 and metrics["regen_step_s"] > 0  # each phase's price per step
            trainer.publish()
        runs[backend] = (selected, {k: v.detach().clone() for k, v in trainer.state.theta_parameters().items()})
    (ao_rewards, ao_theta), (project_rewards, project_theta) = runs["torchao"], runs["project"]
    assert ao_rewards == project_rewards
    assert ao_theta.keys() == project_theta.keys()
    assert all(torch.equal(ao_theta[k], project_theta[k]) for k in ao_theta)


def test_the_iteration_record_prices_a_step_of_each_phase_and_warns_when_exploring_costs_more() -> None:
    from learner.iteration_record import Finished, IterationRecord, Published, TrainResult, Work
    from learner.run_log import progress_line

    def row(explore_step_s: float) -> dict:
        train = TrainResult(0, 1, 0, False, Work(), {"reward_mean": 0.5}, {}, 1.0, 1.0, 2.0,
                            step_s={"regen_step_s": 0.02})
        return IterationRecord(train, Work(), Published(1, 0.1), Finished({}), 0,
                               {"explore_s": 1.0, "explore_step_s": explore_step_s}).row()

    cheap, dear = row(0.01), row(0.03)
    assert cheap["explore_regen_step_ratio"] == pytest.approx(0.5) and dear["explore_regen_step_ratio"] > 1
    assert "step lp/fp 0.50" in progress_line(cheap) and "WARNING" not in progress_line(cheap)
    assert "step lp/fp 1.50 WARNING: a low-precision step costs more" in progress_line(dear)
