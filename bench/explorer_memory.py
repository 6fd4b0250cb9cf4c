"""Resident memory of one explorer's model, before and after the engine took over the policy's transformer.

    python -m bench.explorer_memory [--json bench/results/explorer_memory.json]

An explorer holds its policy (text encoders, VAE, transformer) and its low-precision engine. Before, the
engine was a quantized copy of the transformer, kept beside the policy's own (which the `lora` codec merged
adapters onto); now the engine quantizes the policy's transformer in place
(`ExploreEngine(policy, config, in_place=True)`) and the subscriber copies, at the first `lora` snapshot,
the weights of the adapted layers only. Both arrangements are built here as an explorer builds them, for
each model and codec, each in a fresh process (so one does not inherit the other's heap), and after a
snapshot of that codec was loaded:
    rss     the process's resident set size less its size before the model was loaded (psutil; freed heap
            returned to the system first, malloc_trim), after a first load and engine were built and
            dropped, so the imports' share cancels; every tensor is read once before (as sampling reads
            them: weights loaded from safetensors map the file, and a page is resident once touched)
    held    the bytes of the distinct tensor storages the explorer's modules and LoRA base hold: exact,
            what the RSS difference should approach
Models: the embedded one (configs/embedded.yaml's engine: the 8 FFN Linears in NVFP4), the tiny SD3.5, FLUX
and SANA pipelines (`diffusion.tiny`, every Linear in NVFP4 as the tests run them) and the tiny SD3.5 with a
wider transformer (8 blocks of width 512, 73.5 M parameters), where the saving stands well above the noise
of a process's RSS. All float32 on the CPU, the project backend (NVFP4 emulated: it keeps a fake-quantized
copy of each quantized weight, in both arrangements).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

MIB = 2**20  # the table and the JSON count MiB
CODECS = ("dense", "nvfp4", "lora")
ARRANGEMENTS = ("before", "after")  # the policy's transformer + the engine's copy; the engine alone
WIDE_SD3 = dict(sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=8, attention_head_dim=64,
                num_attention_heads=8, joint_attention_dim=32, caption_projection_dim=512, pooled_projection_dim=24,
                pos_embed_max_size=8)


def held_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (each shared storage once)."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def module_tensors(modules) -> list[torch.Tensor]:
    return [t for m in modules if isinstance(m, nn.Module) for t in (*m.parameters(), *m.buffers())]


def resident_bytes() -> int:
    """This process's RSS after a collection, with the C heap's free pages handed back (glibc)."""
    import psutil

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: RSS keeps freed heap, in both arms alike
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return psutil.Process().memory_info().rss


def lora_snapshot(transformer: nn.Module, targets: tuple[str, ...], rank: int = 4) -> dict[str, torch.Tensor]:
    """Adapters of rank `rank` on the Linears the learner adapts (the names ending in one of the family's
    LoRA targets, as `cluster.check.lora_layers` picks them), seeded."""
    g = torch.Generator().manual_seed(0)
    adapters = {}
    for name, module in transformer.named_modules():
        if type(module) is nn.Linear and any(name.endswith(t) for t in targets):
            adapters[f"{name}.lora_A.weight"] = 0.01 * torch.randn(rank, module.in_features, generator=g)
            adapters[f"{name}.lora_B.weight"] = 0.01 * torch.randn(module.out_features, rank, generator=g)
    return adapters


def measure(folder: str, resolution: int | None, min_dim: int, arrangement: str, codec: str) -> dict[str, float]:
    """One explorer's model in `arrangement`, after one `codec` snapshot (run in a fresh process)."""
    from diffusion.config import ExploreConfig
    from diffusion.explore import ExploreEngine
    from diffusion.loading import load_policy
    from diffusion.quant.engine import weight_tensors
    from weight_sync.codecs import decode, encode
    from weight_sync.subscriber import WeightSubscriber

    torch.set_num_threads(1)
    config = ExploreConfig(precision="nvfp4", backend="project", allow_emulation=True, min_dim=min_dim)
    warm = load_policy(folder, resolution=resolution)  # every module the load imports, imported now
    ExploreEngine(warm, config)
    del warm
    start = resident_bytes()
    policy = load_policy(folder, resolution=resolution)
    transformer = held_bytes(module_tensors([policy.transformer]))
    adapters = lora_snapshot(policy.transformer, policy.family.lora_targets) if codec == "lora" else {}
    if arrangement == "before":
        engine = ExploreEngine(policy, config)
        subscriber = WeightSubscriber(None, engine, base=policy.transformer.state_dict())
    else:
        engine = ExploreEngine(policy, config, in_place=True)
        subscriber = WeightSubscriber(None, engine)
    if codec == "lora":
        arrays, manifest = encode(adapters, "lora", version=1, meta={"lora_scale": 2.0})
    else:
        state = {k: v.detach().clone() for k, v in weight_tensors(engine.module).items()}
        arrays, manifest = encode(state, codec, version=1, quantize=engine.plan.quantized_weights)
        del state
    subscriber.apply(decode(arrays, manifest), manifest)
    del arrays, adapters
    base = subscriber.base if arrangement == "after" else {}  # before: views of the policy's transformer
    tensors = [*module_tensors([*policy.components.values(), engine.module]), *(base or {}).values()]
    with torch.no_grad():  # read every tensor once, as sampling does: weights loaded from safetensors are
        for tensor in tensors:  # mapped from the file, and a page counts in the RSS once it is touched
            tensor.sum()
    rss = resident_bytes() - start
    held = held_bytes(tensors)
    return {"rss_mib": rss / MIB, "held_mib": held / MIB, "transformer_mib": transformer / MIB,
            "lora_base_mib": held_bytes((base or {}).values()) / MIB}


def in_fresh_process(*args) -> dict[str, float]:
    """`measure(*args)` in a new interpreter: its RSS is this model's and nothing else's."""
    done = subprocess.run([sys.executable, "-m", "bench.explorer_memory", "--measure", json.dumps(args)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def model_folders(root: Path) -> dict[str, tuple[str, int | None, int]]:
    """name → (folder, resolution, min_dim) of every model measured; the tiny ones are saved under `root`."""
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline

    from diffusion.config import EMBEDDED_MODEL
    from diffusion.tiny import build_tiny_pipeline, save_tiny_pipeline

    folders: dict[str, tuple[str, int | None, int]] = {"embedded": (str(EMBEDDED_MODEL), None, 64)}
    for family in ("sd3", "flux", "sana"):
        folders[f"tiny {family}"] = (str(save_tiny_pipeline(family, root / family)), 32, 0)
    torch.manual_seed(0)
    tiny = build_tiny_pipeline("sd3")
    wide = StableDiffusion3Pipeline(**{**tiny.components, "transformer": SD3Transformer2DModel(**WIDE_SD3).eval()})
    wide.save_pretrained(root / "sd3_wide", safe_serialization=True)
    folders["tiny sd3, wide transformer"] = (str(root / "sd3_wide"), 32, 0)
    return folders


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # the child's arguments
    args = parser.parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(*json.loads(args.measure))))
        return
    rows = []
    print("| model | transformer MiB | codec | RSS before MiB | RSS after MiB | saved MiB | held before MiB | "
          "held after MiB | saved MiB | of which LoRA base MiB |\n|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (folder, resolution, min_dim) in model_folders(Path(tmp)).items():
            for codec in CODECS:
                before, after = (in_fresh_process(folder, resolution, min_dim, a, codec) for a in ARRANGEMENTS)
                row = {"model": name, "codec": codec, "before": before, "after": after,
                       "rss_saved_mib": before["rss_mib"] - after["rss_mib"],
                       "held_saved_mib": before["held_mib"] - after["held_mib"]}
                rows.append(row)
                print(f"| {name} | {before['transformer_mib']:.2f} | {codec} | {before['rss_mib']:.1f} | "
                      f"{after['rss_mib']:.1f} | {row['rss_saved_mib']:.1f} | {before['held_mib']:.2f} | "
                      f"{after['held_mib']:.2f} | {row['held_saved_mib']:.2f} | {after['lora_base_mib']:.2f} |",
                      flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
