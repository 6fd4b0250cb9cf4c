"""What only a CUDA GPU runs (``gpu``-marked: skipped elsewhere; ``python -m bench.gpu_check`` runs them there).

The engines' numerics on CUDA against the CPU paths the rest of the suite checks, and one iteration of each
objective in bf16 on the GPU: regeneration, the update, the engine refresh.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from engines import quantize
from torch import nn

from diffusion.quant import build_engine, nvfp4_fake_quant

pytestmark = pytest.mark.gpu


def mlp() -> nn.Sequential:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))


def test_modelopt_nvfp4_on_cuda_is_bit_exact_with_the_projects_cpu_path() -> None:
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = build_engine(mlp().cuda(), "nvfp4", "modelopt", linears=["0", "2"])
    cpu = quantize(mlp(), "nvfp4", backend="project")
    with torch.no_grad():
        # The weights as modelopt quantizes them, against the project's NVFP4 (the CPU reference).
        for name in ("0", "2"):
            layer = engine.get_submodule(name)
            modelopt_weight = layer.weight_quantizer(layer.weight).cpu()
            assert torch.equal(modelopt_weight, nvfp4_fake_quant(mlp().get_submodule(name).weight.detach()))
        torch.testing.assert_close(engine(x.cuda()).cpu(), cpu(x), rtol=1e-5, atol=1e-5)


def test_torchao_fp8_on_cuda_quantizes_as_on_the_cpu_and_runs_real_gemms() -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need sm_89 or newer")
    gpu = quantize(mlp().cuda().bfloat16(), "fp8", backend="torchao")
    cpu = quantize(mlp().bfloat16(), "fp8", backend="torchao")
    for name in ("0", "2"):
        assert torch.equal(gpu.get_submodule(name).weight_fq.qdata.cpu(), cpu.get_submodule(name).weight_fq.qdata)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    with torch.no_grad():
        torch.testing.assert_close(gpu(x.cuda()).float().cpu(), cpu(x).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("objective", ["nft", "art", "flow_grpo"])
def test_one_bf16_iteration_of_each_objective_on_the_gpu(objective, small_trainer) -> None:
    overrides = ["model.device=cuda", "model.dtype=bfloat16", f"learner.objective={objective}"]
    if objective != "nft":
        overrides.append("learner.decay.type=0")  # these objectives train on-policy (the config's rule)
    trainer = small_trainer(*overrides)
    before = {k: v.detach().clone() for k, v in trainer.state.theta_parameters().items()}
    metrics = trainer.train_iteration(0).metrics()
    trainer.publish()
    after = trainer.state.theta_parameters()
    assert all(v.is_cuda for v in after.values())
    assert any(not torch.equal(before[k], v) for k, v in after.items()), "θ must move"
    assert metrics["regen_step_s"] > 0 and not metrics.get("skipped")
