"""Preflight: is this run possible here, and what will it cost? Seconds, no weights loaded, no actor started.

    python -m cluster.check --config configs/sd35_large.yaml [--set key.path=value ...]

Checks, each a row of the printed table (exit 1 when any fails, 2 on a config error):

- inputs: the config's fields and rules again, prompt files (each prompt one the reward can score), reward
  options, the model folder (every missing or unreadable file named, with the fix:
  `cluster.config.preflight.check_inputs`);
- resources: the placement bundles (learner ranks + explorers + scorers) against the Ray cluster's
  (`cluster.address` / RAY_ADDRESS), or, for a private local Ray, against this machine's GPUs;
- learners: how the iteration's prompt slots split over the learner ranks (`learner.data_parallel.slot_balance`)
  — a warning when the count does not divide them, naming the rank-time that idles and the counts that divide;
- backend: what the explorers will run, in words, on the GPU they will get (`diffusion.quant.choose_engine`):
  real NVFP4 GEMMs (TE, Blackwell), real FP8 GEMMs (torchao, Hopper/Ada), BF16, or an emulation — a warning
  on a GPU, a failure unless explore.allow_emulation;
- plan: the engine's layer plan on the real architecture (built on the meta device from the folder's
  transformer config): how many Linears / 1×1 convs and parameters run in low precision;
- memory: an estimate per actor (formulas in `estimate_memory`) against its share of the GPU it will get: this
  node's CUDA device, else one GPU of the Ray cluster (read by a one-GPU task), else "not compared"; a failure
  names the options that make it fit;
- shm: the learner's weight-sync region (two slots of the snapshot, `snapshot_estimate`) against the free
  space of /dev/shm — a warning when short, as the service then uses Ray's object store.

`python -m cluster.launch` runs the same checks before it starts anything; the inputs check only once, in its
resolve (before it writes anything), so its table reuses that pass (`run_checks(..., inputs_checked=True)`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from cluster.config.loading import ConfigError, add_config_arguments, load_config, one_line
from cluster.config.preflight import check_inputs, check_model
from cluster.config.schema import SolRLConfig
from diffusion.loading import weight_files
from diffusion.quant import DeviceFacts, EngineChoice
from learner.data_parallel import slot_balance

GiB = 2**30


@dataclass(frozen=True)
class Row:
    check: str
    ok: bool | None  # None: a warning, printed but not a failure
    detail: str
    evaluated: bool = True  # False: it needs what another row found broken (printed, not counted as failed)


# ---- the real architecture, without weights --------------------------------------------------------------
def meta_transformer(folder: Path) -> nn.Module:
    """The folder's transformer built on the meta device from its config: shapes only, no memory."""
    import diffusers

    config = json.loads((folder / "transformer" / "config.json").read_text())
    cls = getattr(diffusers, config["_class_name"])
    with torch.device("meta"):
        return cls.from_config(config)


def _shapes_only(folder: Path, model: nn.Module) -> dict[str, object]:
    """What `Family.latent_shape` reads — the transformer and the VAE's config — without weights."""
    components: dict[str, object] = {"transformer": model}
    vae_config = folder / "vae" / "config.json"
    if vae_config.is_file():
        components["vae"] = SimpleNamespace(config=SimpleNamespace(**json.loads(vae_config.read_text())))
    return components


def stored_parameters(folder: Path) -> dict[str, int]:
    """Parameters per component, read from its safetensors headers (nothing else is read)."""
    counts: dict[str, int] = {}
    for component in sorted(p for p in folder.iterdir() if p.is_dir()):
        total = 0
        for file in weight_files(component):
            with file.open("rb") as handle:
                header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
            total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
        if total:
            counts[component.name] = total
    return counts


# ---- the rows --------------------------------------------------------------------------------------------
def resources_row(config: SolRLConfig) -> Row:
    c = config.cluster
    need_gpus, need_cpus = c.total("GPU"), c.total("CPU")
    address = c.address or os.environ.get("RAY_ADDRESS")
    if address:
        import ray

        ray.init(address=address, log_to_driver=False)
        try:
            have = ray.cluster_resources()
        finally:
            ray.shutdown()
        have_gpus, have_cpus = have.get("GPU", 0.0), have.get("CPU", 0.0)
        ok = have_gpus >= need_gpus and have_cpus >= need_cpus
        return Row("resources", ok, f"bundles need {need_gpus:g} GPU, {need_cpus:g} CPU; the cluster at {address} has "
                   f"{have_gpus:g} GPU, {have_cpus:g} CPU" + ("" if ok else ": add nodes or lower cluster.*.num_gpus"))
    gpus = torch.cuda.device_count()
    detail = f"bundles need {need_gpus:g} GPU, {need_cpus:g} CPU; a private local Ray on this machine ({gpus} GPU)"
    if gpus >= need_gpus:
        return Row("resources", True, detail)
    # Not a failure: tests and demos run GPU-shaped plans on CPU machines on purpose.
    return Row("resources", None, detail + "; logical GPUs stand in for the missing ones and the models run on "
               "the CPU — for a real run submit to a GPU cluster (cluster.address or RAY_ADDRESS)")


def learners_row(config: SolRLConfig) -> Row:
    """The slots each learner rank trains (`learner.data_parallel.owner_of`): ok when the count divides
    prompts.per_iteration; else a warning with what the unevenness costs and the counts that divide."""
    prompts, ranks = config.prompts.per_iteration, config.cluster.learner.count
    balance = slot_balance(prompts, ranks)
    if balance.even:
        return Row("learners", True, balance.describe())
    multiples = sorted({prompts // ranks * ranks, -(-prompts // ranks) * ranks} - {0})
    return Row("learners", None, f"{balance.describe()}; to balance, set cluster.learner.count to "
               f"{' or '.join(map(str, balance.even_rank_counts))}, or prompts.per_iteration to "
               f"{' or '.join(map(str, multiples))} (multiples of {ranks})")


def explorer_device(config: SolRLConfig, gpu: GpuFacts) -> DeviceFacts:
    """The facts of the device the explorers' engines will run on: the GPU an actor gets (`gpu_facts`) when
    explorers take GPUs and the model is not pinned to the CPU; else this machine's CPU."""
    from diffusion.quant import device_facts

    if gpu.device is not None and config.cluster.explorers.num_gpus > 0 and config.model.device != "cpu":
        return gpu.device
    return device_facts(torch.device("cpu"))


def backend_row(config: SolRLConfig, device: DeviceFacts, where: str) -> tuple[Row, EngineChoice | None]:
    """What the explorers will run, in words (`diffusion.quant.choose_engine` on `device`): real NVFP4/FP8
    GEMMs, BF16, or an emulation — refused unless explore.allow_emulation (the row fails, naming the fix)."""
    from diffusion.quant import choose_engine

    try:
        choice = choose_engine(config.explore.precision, config.explore.backend, device,
                               allow_emulation=config.explore.allow_emulation)
    except ValueError as exc:
        return Row("backend", False, one_line(str(exc))), None
    return Row("backend", None if choice.emulated and device.capability is not None else True,
               f"{choice.summary} ({where})"), choice


def resolved_precision(config: SolRLConfig) -> str:
    """The explore precision `config` names; `auto` (a config not passed through `with_engine`) as this
    machine would resolve it."""
    from diffusion.quant import choose_engine, device_facts

    if config.explore.precision != "auto":
        return config.explore.precision
    return choose_engine("auto", "auto", device_facts(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
                         ).precision


def with_engine(config: SolRLConfig, choice: EngineChoice | None) -> SolRLConfig:
    """`config` with the explore precision and backend the choice resolved (what the plan and the weight-sync
    estimate are of); unchanged when nothing was chosen."""
    if choice is None:
        return config
    explore = config.explore.model_copy(update={"precision": choice.precision, "backend": choice.backend
                                                if choice.backend != "none" else "auto"})
    return config.model_copy(update={"explore": explore})


def plan_row(config: SolRLConfig, model: nn.Module, family) -> Row:
    from diffusion.quant import eligible_layers

    quant = family.quant
    layers = eligible_layers(model, skip=tuple(quant.skip if config.explore.skip is None else config.explore.skip),
                             min_dim=quant.min_dim if config.explore.min_dim is None else config.explore.min_dim,
                             conv1x1=quant.conv1x1)
    chosen = [*layers.linears, *layers.convs]
    linears = sum(type(m) is nn.Linear for m in model.modules())
    low = sum(model.get_submodule(n).weight.numel() for n in chosen)
    total = sum(p.numel() for p in model.parameters())
    detail = (f"{len(layers.linears)} of {linears} Linears" + (f" and {len(layers.convs)} 1×1 convs" if layers.convs
              else "") + f" in {resolved_precision(config)}: {low / 1e6:.1f} M of {total / 1e6:.1f} M transformer "
              f"parameters ({low / max(total, 1):.0%})")
    return Row("plan", bool(chosen) or resolved_precision(config) == "none", detail if chosen else
               detail + "; nothing would run in low precision: lower explore.min_dim or shorten explore.skip")


def lora_layers(config: SolRLConfig, model: nn.Module, family) -> list[tuple[str, nn.Linear]]:
    """The Linears the LoRA adapters go on: `training.lora_targets`, else the family's."""
    targets = tuple(config.training.lora_targets or family.lora_targets)
    return [(name, m) for name, m in model.named_modules()
            if type(m) is nn.Linear and any(name.endswith(t) for t in targets)]


def estimate_memory(config: SolRLConfig, model: nn.Module, family, params: dict[str, int]) -> dict[str, float]:
    """GiB per actor: weights, adapters and optimizer, activations. The formulas (estimates, not measurements):

    weights      parameters × 2 bytes (bf16; 4 for float32); the learner's text encoders are not resident with
                 model.offload_text_encoders; an explorer holds one transformer (its engine is the policy's
                 own, quantized in place) and, with cluster.codec = lora, a copy of the targeted Linears'
                 weights the adapters merge onto
    LoRA         Σ r·(in + out) over the targeted Linears, fp32 (peft's adapter dtype): θ, θ_old, the EMA,
                 θ's gradient and AdamW's two moments = 7 copies; full training: θ_old, the reference, the EMA
                 and the gradient in the weights' dtype, the two moments in fp32
    activations  per block ≈ 34·s·B·h bytes in 16 bits (Korthikanti et al. 2022, "Reducing Activation
                 Recomputation in Large Transformer Models", without the attention-score term, which SDPA does
                 not keep): s = image + text tokens, h = width, B = learner.micro_batch; with gradient
                 checkpointing 2·s·B·h per block plus one block's 34·s·B·h; an explorer samples explore.batch_size
                 candidates at once (default: all N) and keeps one block's working set, 34·s·n·h
    """
    dtype_bytes = 4 if config.model.dtype == "float32" else 2
    cfg = model.config
    width = cfg.num_attention_heads * cfg.attention_head_dim
    blocks = cfg.num_layers + getattr(cfg, "num_single_layers", 0)
    channels, h, w = family.latent_shape(_shapes_only(config.model.folder(), model), config.model.resolution)
    s = family.image_tokens((channels, h, w), cfg) + family.text_tokens()
    transformer = params.get("transformer", sum(p.numel() for p in model.parameters()))
    text = sum(n for name, n in params.items() if name.startswith("text_encoder"))
    vae = params.get("vae", 0)
    offload = getattr(config.model, "offload_text_encoders", False)
    checkpointing = getattr(config.training, "gradient_checkpointing", False)
    targeted = lora_layers(config, model, family)
    lora = sum((m.in_features + m.out_features) * config.training.lora_rank for _, m in targeted)
    lora_base = sum(m.in_features * m.out_features for _, m in targeted) if config.cluster.codec == "lora" else 0
    training = 7 * 4 * lora if config.training.mode == "lora" else transformer * (4 * dtype_bytes + 8)
    batch = config.learner.micro_batch
    per_block = 34 * s * batch * width
    activations = (2 * s * batch * width * blocks + per_block) if checkpointing else per_block * blocks
    learner = (transformer + (0 if offload else text) + vae) * dtype_bytes + training + activations * dtype_bytes / 2
    at_once = min(config.prompts.candidates, config.explore.batch_size or config.prompts.candidates)
    sampling = 34 * s * at_once * width  # one block's working set, the candidates sampled at once
    explorer = (transformer + lora_base + text + vae) * dtype_bytes + sampling * dtype_bytes / 2
    return {"learner": learner / GiB, "explorer": explorer / GiB, "learner_activations": activations / GiB,
            "learner_training_state": training / GiB, "explorer_lora_base": lora_base * dtype_bytes / GiB}


def reward_weights_gib(config: SolRLConfig) -> float:
    """The configured reward models' weight files, in GiB (the files `Reward.required_files` names)."""
    from rewards.base import reward_class

    files = {file.path for name in config.reward.weights
             for file in reward_class(name).required_files(**config.reward.options.get(name, {}))}
    return sum(path.stat().st_size for path in files if path.is_file()) / GiB


# What lowers each actor's estimate (`estimate_memory`), named when it does not fit its GPU.
MEMORY_FIXES = {
    "learner": "training.gradient_checkpointing=true, model.offload_text_encoders=true, a smaller learner.micro_batch",
    "explorer": "a smaller explore.batch_size (fewer candidates per forward), model.offload_text_encoders=true",
}


@dataclass(frozen=True)
class GpuFacts:
    """The GPU an actor will get, as far as it is known before anything starts."""

    gib: float | None  # None: not known, so not compared
    source: str  # where the figures come from, or why there are none
    device: DeviceFacts | None = None  # its compute capability and libraries; None: not known


def gpu_facts(config: SolRLConfig, probe_timeout_s: float = 60.0) -> GpuFacts:
    """The GPU an actor will get: this machine's first CUDA device when it has one; else, on a Ray cluster
    (`cluster.address` / RAY_ADDRESS) with GPUs, one GPU's as a one-GPU task on it reads it (waiting at most
    `probe_timeout_s` for a free GPU); else unknown."""
    from diffusion.quant import device_facts

    if torch.cuda.is_available():
        return GpuFacts(torch.cuda.get_device_properties(0).total_memory / GiB,
                        f"this node's {torch.cuda.get_device_name(0)}", device_facts(torch.device("cuda", 0)))
    address = config.cluster.address or os.environ.get("RAY_ADDRESS")
    if not address:
        return GpuFacts(None, "no GPU here, and no Ray cluster named (cluster.address or RAY_ADDRESS)")
    import ray

    ray.init(address=address, log_to_driver=False)
    try:
        if ray.cluster_resources().get("GPU", 0) < 1:
            return GpuFacts(None, f"the cluster at {address} has no GPU")
        probe = ray.remote(num_gpus=1, num_cpus=0)(_device_facts).remote()
        ready, _ = ray.wait([probe], timeout=probe_timeout_s)
        if not ready:
            ray.cancel(probe, force=True)
            return GpuFacts(None, f"no GPU of the cluster at {address} was free within {probe_timeout_s:.0f} s")
        gib, name, device = ray.get(probe)
    finally:
        ray.shutdown()
    if gib is None:
        return GpuFacts(None, f"the cluster at {address} has logical GPUs without a CUDA device behind them")
    return GpuFacts(gib, f"a GPU of the cluster at {address}: {name}", device)


def _device_facts() -> tuple[float | None, str, DeviceFacts | None]:
    """On a GPU worker: (GiB, name, facts) of the GPU Ray gave it; (None, '', None) without a CUDA device."""
    import torch

    from diffusion.quant import device_facts

    if not torch.cuda.is_available():
        return None, "", None
    return (torch.cuda.get_device_properties(0).total_memory / 2**30, torch.cuda.get_device_name(0),
            device_facts(torch.device("cuda", 0)))


def memory_row(config: SolRLConfig, model: nn.Module, family, params: dict[str, int],
               gpu_gib: float | None = None, source: str = "no GPU here") -> Row:
    """Each actor's estimate against its share of a GPU of `gpu_gib` GiB (`num_gpus` of one device; an actor
    without a GPU is not compared; `source`: where the figure came from, or why there is none); fails naming the
    options that lower what does not fit."""
    m = estimate_memory(config, model, family, params)
    at_once = min(config.prompts.candidates, config.explore.batch_size or config.prompts.candidates)
    where = "each scorer" if config.cluster.scorers.count else "each explorer and the learner"
    detail = (f"≈ {m['learner']:.1f} GiB per learner (training state {m['learner_training_state']:.1f}, activations "
              f"{m['learner_activations']:.1f} at micro-batch {config.learner.micro_batch}), ≈ {m['explorer']:.1f} GiB "
              f"per explorer ({at_once} candidates at once); estimates, plus the reward models' "
              f"{reward_weights_gib(config):.2f} GiB of weights on {where}")
    if gpu_gib is None:
        return Row("memory", True, f"{detail}; not compared with a GPU's memory ({source})")
    shares = {"learner": config.cluster.learner.num_gpus, "explorer": config.cluster.explorers.num_gpus}
    room = {actor: gpu_gib * min(share, 1) for actor, share in shares.items() if share}  # CPU actors: not compared
    if not room:
        return Row("memory", True, f"{detail}; not compared: no actor takes a GPU")
    short = [f"each {actor} needs ≈ {m[actor]:.1f} GiB of its {room[actor]:.1f} GiB GPU share; lower it with "
             f"{MEMORY_FIXES[actor]}" for actor in room if m[actor] > room[actor]]
    if short:
        return Row("memory", False, f"{detail}; " + "; ".join(short))
    return Row("memory", True, f"{detail}; fits a {gpu_gib:.0f} GiB GPU ({source})")


def snapshot_estimate(config: SolRLConfig, model: nn.Module, family) -> tuple[str, int]:
    """The weight-sync codec and the bytes one snapshot takes in a shared-memory slot (`weight_sync.shm.slot_bytes`)
    — what the learner publishes, θ_old as the transformer's state dict (`Trainer.sampling_weights`) — from the
    meta-device transformer: dense, every tensor in the run's dtype; nvfp4, the layer plan's weights packed at
    4.5 bits per element (codes two per byte, one E4M3 scale per 16) plus an FP32 scale; lora, the adapters alone
    in fp32. An estimate: a backend may leave out some layers of the plan (TE: dims not multiples of 16)."""
    from actors.learner import codec_for
    from diffusion.explore import ExplorePlan
    from diffusion.quant import NVFP4_WEIGHT_PRECISIONS, eligible_layers
    from weight_sync.codecs import Entry, Manifest
    from weight_sync.shm import slot_bytes

    quant, precision = family.quant, resolved_precision(config)
    quantized: tuple[str, ...] = ()
    if precision in NVFP4_WEIGHT_PRECISIONS:
        layers = eligible_layers(model, skip=tuple(quant.skip if config.explore.skip is None else config.explore.skip),
                                 min_dim=quant.min_dim if config.explore.min_dim is None else config.explore.min_dim,
                                 conv1x1=quant.conv1x1)
        quantized = tuple(f"{name}.weight" for name in (*layers.linears, *layers.convs))
    plan = ExplorePlan(precision, config.explore.backend, (), (), quantized)
    codec = codec_for(plan, config.cluster.codec)
    on_gpu = config.model.device != "cpu" and config.cluster.learner.num_gpus > 0 and \
        bool(config.cluster.address or os.environ.get("RAY_ADDRESS") or torch.cuda.is_available())
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(
        config.model.dtype, torch.bfloat16 if on_gpu else torch.float32)  # auto: as `load_policy_from_config`
    if codec == "lora":
        rank = config.training.lora_rank
        tensors = {f"{name}.lora_{part}.weight": (shape, torch.float32)
                   for name, m in lora_layers(config, model, family)
                   for part, shape in (("A", (rank, m.in_features)), ("B", (m.out_features, rank)))}
    else:
        tensors = {name: (tuple(t.shape), dtype if t.is_floating_point() else t.dtype)
                   for name, t in model.state_dict().items()}
    payload, arrays, entries = 0, 0, []
    for name, (shape, kind) in tensors.items():
        numel = math.prod(shape)
        packed = codec == "nvfp4" and name in quantized
        payload += numel // 2 + numel // 16 + 4 if packed else numel * kind.itemsize
        arrays += 3 if packed else 1
        entries.append(Entry(name, shape, str(kind).removeprefix("torch."), "nvfp4" if packed else "dense", "0" * 8))
    manifest = Manifest(0, codec, tuple(entries), {"lora_scale": 0.0} if codec == "lora" else {})
    return codec, slot_bytes(payload, arrays, len(json.dumps(manifest.to_json())))


def shm_row(config: SolRLConfig, model: nn.Module, family, free: int | None = None) -> Row:
    """The learner's shared-memory region against the room in /dev/shm (`free`: its free bytes; None: statvfs).
    A warning, not a failure, when short: the service then sends snapshots through the object store."""
    from weight_sync.shm import SHM_FOLDER, region_bytes, region_shortfall, shm_free_bytes, size_text

    codec, nbytes = snapshot_estimate(config, model, family)
    free = shm_free_bytes() if free is None else free
    detail = f"weight-sync region {size_text(region_bytes(nbytes))} (2 slots for {codec} snapshots of " \
             f"{size_text(nbytes)})"
    if config.cluster.address or os.environ.get("RAY_ADDRESS"):
        return Row("shm", True, f"{detail} in {SHM_FOLDER} of the learner's node (checked there: short of room, "
                   "it sends them through the object store)")
    problem = region_shortfall(nbytes, free)
    if problem is not None:
        return Row("shm", None, problem)
    if free is None:
        return Row("shm", True, f"{detail}; no {SHM_FOLDER} here to check")
    return Row("shm", True, f"{detail}; {SHM_FOLDER} has {size_text(free)} free")


def run_checks(config: SolRLConfig, *, inputs_checked: bool = False) -> list[Row]:
    """Every row; the model-dependent ones only once the model folder passes. `inputs_checked`: the caller
    already ran `check_inputs` on this config — resolved, its hub ids local folders — and printed its notes
    (`cluster.launch` does), so the inputs row reports that pass rather than reading every file a second time."""
    from diffusion.families import family_for_transformer

    inputs, config = _inputs_row(config, inputs_checked)
    gpu = gpu_facts(config)
    device = explorer_device(config, gpu)
    backend, choice = backend_row(config, device, gpu.source if device is gpu.device else "the CPU of this machine")
    rows = [inputs, resources_row(config), learners_row(config), backend]
    config = with_engine(config, choice)
    try:  # the model's rows need only the model folder: evaluated whatever else the inputs row found
        config, _ = check_model(config)
    except ConfigError as exc:
        return [*rows, Row("plan", False, f"not evaluated: {exc}", evaluated=False),
                *(Row(name, False, "not evaluated: it needs the model folder (above)", evaluated=False)
                  for name in ("memory", "shm"))]
    folder = config.model.folder()
    model = meta_transformer(folder)
    family = family_for_transformer(type(model).__name__)
    params = stored_parameters(folder)
    memory = memory_row(config, model, family, params, gpu.gib, gpu.source)
    return [*rows, plan_row(config, model, family), memory, shm_row(config, model, family)]


def _inputs_row(config: SolRLConfig, inputs_checked: bool) -> tuple[Row, SolRLConfig]:
    """The inputs row, and the config with its hub ids resolved (as given when the inputs fail)."""
    notes: list[str] = []
    if not inputs_checked:
        try:
            checked = check_inputs(config)
        except ConfigError as exc:
            return Row("inputs", False, str(exc)), config
        config, notes = checked.config, checked.notes
    scored = ", ".join(config.reward.weights)
    return Row("inputs", True, f"prompts (each one scorable by {scored}), reward, model folder"
               + (f" ({'; '.join(notes)})" if notes else "")), config


def format_rows(rows: list[Row]) -> str:
    width = max(len(r.check) for r in rows)
    status = {True: "ok  ", False: "FAIL", None: "warn"}
    return "\n".join(f"{status[r.ok] if r.evaluated else '----'}  {r.check:<{width}}  {r.detail}" for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.set)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = run_checks(config)
    print(format_rows(rows))
    failed = [r.check for r in rows if r.ok is False and r.evaluated]
    if failed:
        print(f"\n{len(failed)} check(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
