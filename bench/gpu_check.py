"""The prepared GPU check: what only a GPU can say, in one short run on one GPU, without Ray, TE or network.

    python -m bench.gpu_check --out DIR                     # on the GPU machine (make gpu-check)
    python -m bench.gpu_check --out DIR --device cpu --tiny # the same code on a CPU, tiny models (tested)

Writes DIR/gpu_check.json, DIR/gpu_check.md (the tables) and DIR/costs_<model>.json (`bench.plan --costs`,
`bench.convergence --costs`). Sections, each under its own key:

- ``tests``: the ``gpu``-marked tests (every test that needs CUDA; skipped elsewhere), run by pytest;
- ``step_price``: seconds per denoising step of one sample for full-size transformers built from the
  published configs (``bench.memory``) with random weights (meta-device init, then ``to_empty`` on the GPU:
  no download) at the presets' resolutions and explore batch sizes, in BF16, in the real FP8 engine
  (``torchao``) and in NVFP4 emulation (``modelopt`` on CUDA), each warm and synchronised; the FP8/BF16 ratio
  beside the paper's Blackwell FP4/BF16 0.46; the FP8 engine's refresh after a weight load, against the load;
- ``decode_reward``: the VAE decode and one reward forward (a tiny CLIP at the real 224 px input) per image;
  their sum is the costs files' ``decode_reward_s_per_image`` (d, `bench.prices`), a lower bound: a real
  reward model is larger than the tiny CLIP;
- ``memory``: peak GPU memory of an explorer's forward and of a LoRA learner step (with and without gradient
  checkpointing) against ``bench.memory``'s estimates, less the text encoders and VAE this check does not load;
- ``wheels``: what must be carried to the GPU machine beyond its torch, transformers and peft.

Every measured field is written in both modes; on a CPU the memory fields are null (no CUDA allocator).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.memory import FLUX_DEV, KL_VAE, SD35_LARGE, SD35_MEDIUM
from bench.plan import Costs, save_costs
from diffusion.families import FLUX, SD3
from diffusion.quant import (
    DeviceFacts,
    build_engine,
    choose_engine,
    device_facts,
    engine_layers,
    load_weights,
)

# Beyond the GPU image's torch, transformers and peft: what this check imports (pip download these there).
WHEELS = ("diffusers==0.42.1", "safetensors==0.8.0", "pydantic==2.14.3", "pyyaml==6.0.3", "torchao==0.18.0",
          "nvidia-modelopt==0.47.0", "accelerate==1.15.0", "pytest==9.1.1", "numpy==2.4.6", "scipy==1.17.1")
# The files that hold the gpu-marked tests (a test keeps this list whole): the GPU machine has no Ray, so the
# check collects these alone rather than the whole suite.
GPU_TEST_FILES = ("tests/diffusion/test_gpu_paths.py", "tests/weight_sync/test_planned_gpu_path.py")
PAPER_FP4_BF16 = 0.46  # one FP4 step of SD3.5-L over a BF16 one, Table 5 (REFERENCE §5)
GiB = 2**30


@dataclass(frozen=True)
class Model:
    """A transformer to price: its family, its published config, the preset's resolution and batch sizes."""

    family: Any
    cls: str  # the diffusers class
    config: dict[str, Any]
    resolution: int  # pixels
    explore_batch: int  # the preset's explore.batch_size
    micro_batch: int  # the preset's learner.micro_batch
    text_tokens: int  # prompt embedding length (SD3: 77 CLIP + 128 T5 as the official script; FLUX: T5 512)
    preset: str


FULL = {
    "sd35_medium": Model(SD3, "SD3Transformer2DModel", SD35_MEDIUM, 512, 16, 8, 205, "sd35_medium"),
    "sd35_large": Model(SD3, "SD3Transformer2DModel", SD35_LARGE, 1024, 16, 8, 205, "sd35_large"),
    "flux_dev": Model(FLUX, "FluxTransformer2DModel", FLUX_DEV, 512, 16, 8, 512, "flux_dev"),
}
# The same families at widths of 64 (multiples of 16: torch._scaled_mm takes their FFNs) for --tiny.
TINY = {
    "sd35_medium": Model(SD3, "SD3Transformer2DModel", dict(
        sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=2, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=64, caption_projection_dim=64, pooled_projection_dim=32,
        pos_embed_max_size=16), 64, 2, 2, 8, "sd35_medium"),
    "flux_dev": Model(FLUX, "FluxTransformer2DModel", dict(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=64, pooled_projection_dim=32, guidance_embeds=True,
        axes_dims_rope=(4, 4, 8)), 64, 2, 2, 8, "flux_dev"),
}
TINY_VAE = dict(KL_VAE, block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=32)


def seconds(fn: Callable[[], Any], device: torch.device, *, repeats: int, budget_s: float) -> float:
    """The median wall seconds of `fn` once warm (one untimed call first), each call synchronised."""
    fn()
    synchronize(device)
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < repeats and (not times or time.perf_counter() < deadline):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build modules in `dtype` (diffusers warns about a `.to(dtype)` after the fact)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def random_transformer(model: Model, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The published architecture with random weights: built on the meta device, then allocated on `device`
    (`to_empty`) and filled from a fixed generator (N(0, 0.02), norms' scales 1)."""
    import diffusers

    with torch.device("meta"), default_dtype(dtype):
        transformer = getattr(diffusers, model.cls)(**model.config)
    transformer = transformer.to_empty(device=device).eval()
    generator = torch.Generator(device=device).manual_seed(0)
    for name, param in transformer.named_parameters():
        if param.dim() == 1 and ("norm" in name or name.endswith("scale")):
            param.fill_(1.0 if name.endswith(("weight", "scale")) else 0.0)
        else:
            param.normal_(0.0, 0.02, generator=generator)
    for buffer in transformer.buffers():  # e.g. rotary tables: recomputed by the model where they matter
        if buffer.is_floating_point():
            buffer.zero_()
    return transformer


def conditioning(model: Model, batch: int, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Random prompt embeddings of the family's shapes (what `family.encode` would return)."""
    generator = torch.Generator(device=device).manual_seed(1)
    width = model.config["joint_attention_dim"]
    cond = {"prompt_embeds": torch.randn(batch, model.text_tokens, width, generator=generator, device=device,
                                         dtype=dtype),
            "pooled_projections": torch.randn(batch, model.config["pooled_projection_dim"], generator=generator,
                                              device=device, dtype=dtype)}
    if model.family is FLUX:
        cond["guidance"] = torch.full((batch,), 3.5, device=device)
    return cond


def latents(model: Model, batch: int, device: torch.device, vae_scale: int) -> torch.Tensor:
    side = model.resolution // vae_scale
    channels = 16  # SD3's and FLUX's VAE latent channels (FLUX packs 2×2 of them into its 64 inputs)
    return torch.randn(batch, channels, side, side, generator=torch.Generator(device=device).manual_seed(2),
                       device=device)


def engine(transformer: nn.Module, model: Model, facts: DeviceFacts, tiny: bool,
           label: str) -> tuple[nn.Module, int, str]:
    """`label`'s module, its quantized layer count and backend: ``bf16`` (the transformer itself), ``fp8`` (the
    real FP8 engine) or ``nvfp4_emulated``, on the family's layer rule (every layer with --tiny, whose widths
    are below the real minimums)."""
    if label == "bf16":
        return transformer, 0, "none"
    precision, backend = {"fp8": ("fp8", "torchao"), "nvfp4_emulated": ("nvfp4", "auto")}[label]
    choice = choose_engine(precision, backend, facts, allow_emulation=True)
    quant = model.family.quant
    layers = engine_layers(transformer, choice.backend, skip=() if tiny else quant.skip,
                           min_dim=0 if tiny else quant.min_dim, conv1x1=quant.conv1x1)
    built = build_engine(transformer, choice.precision, choice.backend, linears=layers.linears, convs=layers.convs)
    return built, len(layers.linears) + len(layers.convs), choice.backend


def peak_gib(device: torch.device, fn: Callable[[], Any]) -> float | None:
    """Peak GPU memory (GiB) allocated while `fn` runs; None off CUDA."""
    if device.type != "cuda":
        fn()
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) / GiB


def step_price(model: Model, device: torch.device, dtype: torch.dtype, tiny: bool, repeats: int,
               budget_s: float) -> dict[str, Any]:
    """One model's section: s/step/sample per engine (each built alone, so its peak less the source
    transformer is an explorer's: that engine alone), their ratios, the FP8 refresh, the learner step."""
    facts = device_facts(device)
    transformer = random_transformer(model, device, dtype)
    batch = model.explore_batch
    cond = conditioning(model, batch, device, dtype)
    x = latents(model, batch, device, 2 if tiny else 8)
    sigma = torch.full((batch,), 0.7, device=device)
    row: dict[str, Any] = {"batch": batch, "resolution": model.resolution, "device": facts.name,
                           "params_b": sum(p.numel() for p in transformer.parameters()) / 1e9}
    for label in ("bf16", "fp8", "nvfp4_emulated"):
        module, layers, backend = engine(transformer, model, facts, tiny, label)

        def step(module: nn.Module = module) -> None:
            with torch.no_grad():
                model.family.velocity(module, x, sigma, cond)

        row[f"{label}_s_per_sample_step"] = seconds(step, device, repeats=repeats, budget_s=budget_s) / batch
        peak = peak_gib(device, step)
        # An explorer's engine is its policy's transformer quantized in place: the source this bench keeps for
        # the next engine is not an explorer's (the bf16 "engine" is that transformer itself).
        source = 0.0 if module is transformer else sum(
            t.numel() * t.element_size() for t in (*transformer.parameters(), *transformer.buffers())) / GiB
        row[f"{label}_explorer_peak_gib"] = None if peak is None else peak - source
        row[f"{label}_layers"], row[f"{label}_backend"] = layers, backend
        if label == "fp8":
            row.update(refresh_price(module, transformer, device))
        del module
    row["fp8_over_bf16"] = row["fp8_s_per_sample_step"] / row["bf16_s_per_sample_step"]
    row["nvfp4_emulated_over_bf16"] = row["nvfp4_emulated_s_per_sample_step"] / row["bf16_s_per_sample_step"]
    row["paper_fp4_over_bf16"] = PAPER_FP4_BF16
    row.update(learner_step(model, transformer, device, dtype, tiny))
    return row


def refresh_price(fp8: nn.Module, transformer: nn.Module, device: torch.device) -> dict[str, float]:
    """What a weight sync costs the FP8 engine: copying a new state into it, and re-quantizing its layers in
    place afterwards (`load_weights` does both; the refresh is its time less the copy's)."""
    state = {k: v.detach().clone() for k, v in transformer.state_dict().items()}
    targets = fp8.state_dict(keep_vars=True)
    synchronize(device)
    start = time.perf_counter()
    with torch.no_grad():
        for key, value in state.items():
            targets[key].data.copy_(value)
    synchronize(device)
    copy_s = time.perf_counter() - start
    start = time.perf_counter()
    load_weights(fp8, state)
    synchronize(device)
    return {"fp8_copy_s": copy_s, "fp8_refresh_s": max(time.perf_counter() - start - copy_s, 0.0)}


def learner_step(model: Model, transformer: nn.Module, device: torch.device, dtype: torch.dtype,
                 tiny: bool) -> dict[str, Any]:
    """Seconds and peak memory of one LoRA forward + backward at the preset's micro-batch, with and without
    gradient checkpointing (rank 32 on the family's LoRA targets)."""
    from peft import LoraConfig

    transformer.add_adapter(LoraConfig(r=32, lora_alpha=32, target_modules=list(model.family.lora_targets)))
    batch = model.micro_batch
    cond = conditioning(model, batch, device, dtype)
    x = latents(model, batch, device, 2 if tiny else 8)
    sigma = torch.full((batch,), 0.7, device=device)
    out: dict[str, Any] = {}
    for checkpointing in (False, True):
        if checkpointing:
            transformer.enable_gradient_checkpointing()
        transformer.train()

        def update() -> None:
            loss = model.family.velocity(transformer, x, sigma, cond).float().pow(2).mean()
            loss.backward()
            transformer.zero_grad(set_to_none=True)

        suffix = "_checkpointed" if checkpointing else ""
        try:
            out[f"lora_step_s_per_sample{suffix}"] = seconds(update, device, repeats=2, budget_s=20) / batch
            out[f"learner_peak_gib{suffix}"] = peak_gib(device, update)
        except torch.OutOfMemoryError:
            out[f"lora_step_s_per_sample{suffix}"], out[f"learner_peak_gib{suffix}"] = None, "out of memory"
            torch.cuda.empty_cache()
    transformer.eval()
    return out


@torch.no_grad()
def decode_reward(device: torch.device, dtype: torch.dtype, tiny: bool, repeats: int) -> dict[str, float]:
    """Seconds per image: the KL VAE's decode at 1024 px (SD3/FLUX; 64 px with --tiny) and a tiny CLIP's
    image tower at its real 224 px input."""
    import diffusers
    import transformers as tf

    batch = 4
    with default_dtype(dtype):
        vae = diffusers.AutoencoderKL(**(TINY_VAE if tiny else KL_VAE)).to(device).eval()
        clip = tf.CLIPVisionModelWithProjection(tf.CLIPVisionConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=224,
            patch_size=14, projection_dim=32)).to(device).eval()
    side = 32 if tiny else 128
    z = torch.randn(batch, 16, side, side, device=device, dtype=dtype)
    images = torch.rand(batch, 3, 224, 224, device=device, dtype=dtype)
    return {"decode_px": side * 8 if not tiny else side * 2,
            "vae_decode_s_per_image": seconds(lambda: vae.decode(z), device, repeats=repeats, budget_s=30) / batch,
            "reward_forward_s_per_image": seconds(lambda: clip(pixel_values=images), device, repeats=repeats,
                                                  budget_s=30) / batch}


def memory_estimates(models: list[str]) -> dict[str, dict[str, float]]:
    """`bench.memory`'s estimates per preset (GiB), less the text encoders' and VAE's weights it counts."""
    from bench.memory import estimate
    from bench.memory import models as meta_models

    out = {}
    for name, (family, transformer, text, vae) in meta_models().items():
        if name not in models:
            continue
        m = estimate(name, family, transformer, text, vae, ["model.offload_text_encoders=true"])
        encoders = (sum(m[f"{k}_params_b"] for k in text) + m["vae_params_b"]) * 1e9 * 2 / GiB
        out[name] = {"explorer_gib": m["explorer"] - encoders, "learner_gib": m["learner"], "encoders_gib": encoders}
    return out


def gpu_tests(timeout_s: float) -> dict[str, Any]:
    """`pytest -m gpu` over `GPU_TEST_FILES`: every test that needs CUDA (they skip on a CPU)."""
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                               *GPU_TEST_FILES],
                              capture_output=True, text=True, timeout=timeout_s)
        tail, code = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""], done.returncode
    except subprocess.TimeoutExpired:
        tail, code = [f"timed out after {timeout_s:.0f} s"], -1
    return {"exit_code": code, "summary": tail[0], "seconds": time.perf_counter() - start}


def costs(row: dict[str, Any], decode: dict[str, float] | None = None) -> Costs:
    """Per-phase costs for `bench.plan` / `bench.convergence`: the FP8 and BF16 step prices measured here
    (the transformer's steps alone); training per sample = 6 trained timesteps × (one LoRA forward + backward
    + θ_old's and the reference's forwards, at BF16's step price); `decode` (`decode_reward`): an image's VAE
    decode and reward forward, the same in any precision (0 without it)."""
    train = row.get("lora_step_s_per_sample_checkpointed") or row.get("lora_step_s_per_sample") or 0.0
    per_image = 0.0 if decode is None else decode["vae_decode_s_per_image"] + decode["reward_forward_s_per_image"]
    return Costs(explore_s_per_sample_step=row["fp8_s_per_sample_step"],
                 regen_s_per_sample_step=row["bf16_s_per_sample_step"],
                 train_s_per_sample=6 * (train + 2 * row["bf16_s_per_sample_step"]),
                 decode_reward_s_per_image=per_image)


def gib(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, float) else ("n/a (no CUDA)" if value is None else str(value))


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# GPU check on {result['device_name']} ({result['mode']} models, full precision = {result['dtype']})",
             "",
             f"gpu-marked tests: {result['tests']['summary']} (exit {result['tests']['exit_code']})", "",
             "| model | batch | BF16 s/step/sample | FP8 (torchao) | NVFP4 emulated | FP8/BF16 | emulated/BF16 | "
             "paper FP4/BF16 | FP8 refresh s | copy s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in result["step_price"].items():
        lines.append(f"| {name} | {r['batch']} | {r['bf16_s_per_sample_step']:.4g} | {r['fp8_s_per_sample_step']:.4g} "
                     f"| {r['nvfp4_emulated_s_per_sample_step']:.4g} | {r['fp8_over_bf16']:.2f} | "
                     f"{r['nvfp4_emulated_over_bf16']:.2f} | {r['paper_fp4_over_bf16']:.2f} | {r['fp8_refresh_s']:.3g} "
                     f"| {r['fp8_copy_s']:.3g} |")
    lines += ["", "| model | explorer peak GiB (FP8) | estimate | learner peak GiB | with checkpointing | "
              "estimate (preset's settings) |", "|---|---|---|---|---|---|"]
    for name, r in result["step_price"].items():
        est = result["memory_estimates"].get(name, {})
        lines.append(f"| {name} | {gib(r['fp8_explorer_peak_gib'])} | {gib(est.get('explorer_gib'))} | "
                     f"{gib(r['learner_peak_gib'])} | {gib(r['learner_peak_gib_checkpointed'])} | "
                     f"{gib(est.get('learner_gib'))} |")
    d = result["decode_reward"]
    lines += ["", f"VAE decode at {d['decode_px']} px: {d['vae_decode_s_per_image']:.4g} s/image; reward forward "
              f"(tiny CLIP, 224 px): {d['reward_forward_s_per_image']:.4g} s/image"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny transformers of the same families (CPU mode)")
    parser.add_argument("--models", type=lambda s: s.split(","), default=None,
                        help=f"comma-separated, of {', '.join(FULL)} (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-tests", action="store_true", help="do not run the gpu-marked tests")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: run it on the GPU machine, or with --device cpu --tiny")
    table = TINY if args.tiny else FULL
    names = args.models or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(table)}")
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "mode": "tiny" if args.tiny else "full", "device": args.device,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU",
        "torch": torch.__version__, "dtype": str(dtype).removeprefix("torch."), "wheels": list(WHEELS),
        "tests": {"exit_code": None, "summary": "not run (--skip-tests)", "seconds": 0.0} if args.skip_tests
        else gpu_tests(timeout_s=240),
        "memory_estimates": memory_estimates(names),  # of the real presets, in both modes
        "step_price": {},
    }
    for name in names:
        print(f"pricing {name} ...", flush=True)
        result["step_price"][name] = step_price(table[name], device, dtype, args.tiny, args.repeats, budget_s=20.0)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result["decode_reward"] = decode = decode_reward(device, dtype, args.tiny, args.repeats)
    for name, row in result["step_price"].items():
        save_costs(costs(row, decode), args.out / f"costs_{name}.json")
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (args.out / "gpu_check.md").write_text(text)
    print(text)
    return 0 if result["tests"]["exit_code"] in (None, 0, 5) else 1


if __name__ == "__main__":
    sys.exit(main())
