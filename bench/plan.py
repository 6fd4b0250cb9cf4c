"""Capacity plan: how to split G GPUs between explorers and learners, from per-phase costs.

    python -m bench.plan --gpus G [--model sd35_large|flux_dev|sana_1600m|qwen_image] [--costs FILE]
                         [--learner-efficiency 1.0] [--json FILE]

An iteration has three phases (learner/trainer.py, cluster/driver.py): explore (P prompts × N
candidates × S_x steps, low precision, on explorers), regenerate (P × K kept seeds × S_r steps,
full precision, on learners), train (P × K kept samples, on learners); then the learner publishes
the new weights. The model prices each phase in GPU-seconds and lays it out on GPUs.

Costs (GPU-seconds; one GPU busy for one second is one GPU-second; the price table and its derivation
are `bench.prices`'):
    c_x   explore_s_per_sample_step   one low-precision denoising step of one candidate
    c_r   regen_s_per_sample_step     one full-precision denoising step of one kept seed
    d     decode_reward_s_per_image   decoding one image and scoring it with the reward, any precision
                                      (optional, default 0: the step prices then include it, as a run's
                                      measured costs do). Every image explored or regenerated costs one d.
    c_t   train_s_per_sample          training on one kept sample: all its trained timesteps, forward and
                                      backward. Per sample, not per timestep: the paper reports training per
                                      iteration only, at the presets' timestep_fraction; a run that changes it
                                      should measure c_t again.
    s     sync_s                      wall seconds per iteration to publish weights (optional, default 0)
    o     overhead_s                  wall seconds per iteration of everything else (optional, default 0)

Default costs, from the paper's Table 5 (8 GPUs, every GPU on each phase, synchronous), with
P = 48, N = 96, K = 24, S_x = 6, S_r = 10 as in the presets (`bench.prices` derives them):
    sd35_large, measured per phase: explore 125 s, regenerate 62 s, train 240 s (427 s), naive BF16
        rollout of 96 × 48 at 10 steps 451 s. Per image, decode and reward included (GPU-s):
        explore 125·8 / (48·96) = 0.2170 = 6·c_x + d     regenerate 62·8 / (48·24) = 0.4306 = 10·c_r + d
        naive 451·8 / (48·96)   = 0.7830 = 10·c_b + d    c_t = 240·8 / (48·24) = 1.6667
        Table 5 leaves d open between 0 (c_x / c_b = 0.46, the paper's FP4 step ratio) and 0.1171 (0.25,
        NVFP4's ideal); the default is the midpoint d = 0.05857: c_x = 0.02641, c_r = 0.03720,
        c_b = 0.07244, so c_x / c_b = 0.365, c_r / c_b = 0.513, c_t / c_b = 23.0. Any d of the bracket
        gives Table 5's phase times exactly.
    flux_dev and sana_1600m: only rollout totals are published: naive 274 s → Sol-RL 169 s (FLUX),
        95 s → 76 s (SANA). Derived: c_r, c_t and d as SD3.5-L's multiples of the naive rollout's per-image
        cost (the regeneration pipeline, the training-to-sampling ratio and the decode + reward share carry
        over); c_x takes the rest of the Sol-RL rollout: P·N·(S_x·c_x + d) = rollout·8 − P·K·(S_r·c_r + d).
        This gives c_x / c_b = 0.73 for FLUX and 1.06 for SANA at the default d (0.80 and 1.10 at d = 0):
        at 512 px and 1.6B parameters the FP4 step saves little or nothing, and the rollout gain comes
        from the fewer steps. Assumptions, not measurements: measure and pass --costs.
    qwen_image (not in the paper): SD3.5-L's step and training prices × the transformers' parameter ratio
        (20.43B / 8.15B) at the same 1024 px, d unscaled (`bench.prices.scaled_model_costs`). An estimate.

Layout of one iteration (wall seconds; W_x = P·g, W_r = P·r, W_t = P·K·c_t; g = N·S_x·c_x + N·d one
prompt's exploration on one GPU (with successive halving, `Shape.halving`: (N·f + M·(S_x − f))·c_x +
(N + M)·d); r = K·(S_r·c_r + d) one prompt's regeneration, t = K·c_t its training). Both sides take whole
prompt slots, so both count the busiest GPU's slots:
    Explorers: the pool sends slot s to explorer s mod E (cluster/runtime/explorer_pool.py `submit`) and
        an explorer actor runs its calls one at a time, in the order sent, so explorer j explores slots
        j, j + E, j + 2E, … one after another; the busiest explores ceil(P / E) groups:
        X(E) = ceil(P / E) · g, and slot s's group arrives at (floor(s / E) + 1) · g.
    Learners: rank `learner.data_parallel.owner_of(s, P, L)` regenerates and trains slot s, so ranks take
        floor(P/L) or ceil(P/L) whole slots, and every rank waits for the busiest each iteration (the
        scores are all-gathered before training, the gradients all-reduced after it). Each learner past
        the first adds e of a learner (e = --learner-efficiency, 1: perfect), u(L) = 1 + (L − 1)·e, taken
        as every rank running at u(L)/L of one learner's speed; the busiest rank's ceil(P/L) slots
        (`slot_balance`) then set the group's speedup over one learner:
        u_P(L) = u(L) · (P/L) / ceil(P/L)         (u(L) when L divides P; P/ceil(P/L) in place of L at e = 1)
        R(L) = W_r / u_P(L) = ceil(P/L) · r · L/u(L),   Tr(L) = W_t / u_P(L) = ceil(P/L) · t · L/u(L).
    colocated (the paper): all G GPUs do each phase in turn, T = W_x/G + (W_r + W_t)/u(G) + s + o
        (at e = 1, (W_x + W_r + W_t)/G + s + o: 427 s for SD3.5-L on 8). Every phase is taken as
        divisible: the paper's pipeline shards candidates and samples over all GPUs, where this project's
        actors take whole prompt slots; with G dividing P it makes no difference.
    colocated here: the same on this project's actors, G explorers + G learner ranks at half a GPU each
                           (one of each per GPU), both taking whole prompt slots:
                           T = X(G) + (W_r + W_t)/u_P(G) + s + o — equal to the above when G divides P
    split sync:            T = X(E) + R(L) + Tr(L) + s + o
    split async:           T = max(X(E), R(L) + Tr(L) + s) + o   (explorers explore i + 1 while the
                           learners regenerate and train i: the slower side sets the pace)
    split sync, streamed:  the driver sends each ranked group, as it arrives, to its slot's rank, which
                           regenerates its groups one at a time in arrival order (`streamed_regen_end`
                           plays this out: rank k is free at f_k; slot s, arriving at a_s, ends at
                           f_k ← max(f_k, a_s) + r·L/u(L)); regeneration ends at R_end = max over ranks
                           of f_k, then the ranks gather the scores and train: T = R_end + Tr(L) + s + o
    split async, streamed: the same as async: in steady state each side already works all the time,
                           streaming only shortens the first iteration.
Every group is taken to cost the same g, r and t, and the driver to forward a group at once; with that,
the sync, async and streamed formulas are exact at e = 1. At e < 1 all three spread the group's loss
evenly over its ranks (L/u(L) per rank), an approximation.
Idle fraction: 1 − (the side's GPU-seconds of work) / (its GPUs × T): an explorer or learner rank with a
slot fewer than the busiest idles for that slot's time, and counts here.

Not modeled: memory (a learner holds the full BF16 model, optimizer state and activations of
training; an explorer the FP4 engine and the reward models; the colocated layout holds both on every
GPU, or swaps them), weight sync and quantization unless given as sync_s, the policy lag of async
mode (explorers rank with weights one version old), evaluation and checkpoints, stragglers, unequal
groups (prompts whose candidates take longer), and micro-batches. The slot balance of the best splits'
and the preset's L is printed with them ("learner_slots" in the JSON: `slot_balance`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from bench.prices import (
    D_DEFAULT,
    PAPER_CANDIDATES,
    PAPER_COLOCATED_S,  # noqa: F401  (this and the other noqa names: Table 5's numbers, re-exported)
    PAPER_EXPLORE_STEPS,
    PAPER_GPUS,  # noqa: F401
    PAPER_KEEP,
    PAPER_PROMPTS,
    PAPER_REGEN_STEPS,
    PAPER_ROLLOUT_S,
    SD35_PHASES_S,  # noqa: F401
    Costs,
    measured_note,
    paper_model_costs,
    scaled_model_costs,
)
from learner.data_parallel import owner_of, slot_balance

Mode = Literal["sync", "async"]
MODELS = ("sd35_large", "flux_dev", "sana_1600m")  # Table 5's
ESTIMATED_MODELS = ("qwen_image",)  # priced from SD3.5-L's by parameters (`bench.prices.scaled_model_costs`)


REQUIRED = ("explore_s_per_sample_step", "regen_s_per_sample_step", "train_s_per_sample")
FIELD_HELP = {
    "explore_s_per_sample_step": "GPU-seconds of one low-precision denoising step of one candidate",
    "regen_s_per_sample_step": "GPU-seconds of one full-precision denoising step of one kept seed",
    "train_s_per_sample": "GPU-seconds to train on one kept sample, all its trained timesteps",
    "decode_reward_s_per_image": "GPU-seconds to decode one image and score it with the reward (optional, 0: "
                                 "the step prices include it)",
    "sync_s": "wall seconds per iteration to publish weights",
    "overhead_s": "wall seconds per iteration outside the three phases",
}


@dataclass(frozen=True)
class Shape:
    """One iteration's amounts: prompts P, candidates N, kept K, explore steps S_x, regeneration steps S_r;
    `halving`: successive halving's (first steps f, survivors M), None: one explore pass."""

    prompts: int
    candidates: int
    keep: int
    explore_steps: int
    regen_steps: int
    halving: tuple[int, int] | None = None

    def explore_sample_steps(self) -> int:
        """One prompt's explore sample-steps: N·S_x, or N·f + M·(S_x − f) (`learner.rollouts.Sampling.pool_steps`)."""
        if self.halving is None:
            return self.candidates * self.explore_steps
        first, survivors = self.halving
        return self.candidates * first + survivors * (self.explore_steps - first)

    def explore_scored(self) -> int:
        """One prompt's explored images decoded and scored: N, or N + M (`successive_halving`)."""
        return self.candidates + (self.halving[1] if self.halving is not None else 0)


PAPER_SHAPE = Shape(prompts=PAPER_PROMPTS, candidates=PAPER_CANDIDATES, keep=PAPER_KEEP,
                    explore_steps=PAPER_EXPLORE_STEPS, regen_steps=PAPER_REGEN_STEPS)


class PlanError(ValueError):
    """Bad input to the plan, stated with the fix."""


def paper_costs(model: str, d: float = D_DEFAULT) -> Costs:
    """The default costs of `model`, derived from Table 5 (`bench.prices.paper_model_costs`) at SD3.5-L's
    decode + reward price `d` (default: the midpoint of the bracket Table 5 leaves open); for a model beyond
    the paper (`ESTIMATED_MODELS`), SD3.5-L's scaled by transformer parameters."""
    if model in ESTIMATED_MODELS:
        return scaled_model_costs(model, d)
    if model not in PAPER_ROLLOUT_S:
        raise PlanError(f"unknown model {model!r}: the paper's Table 5 covers {', '.join(MODELS)} (estimated: "
                        f"{', '.join(ESTIMATED_MODELS)}); pick one of them or pass measured costs with --costs FILE")
    return paper_model_costs(model, d)


def load_costs(path: Path) -> Costs:
    """Costs from a JSON file: the fields at the top level, or under "costs" (this tool's own --json output)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanError(f"costs file {path} does not exist; write one with the fields "
                        f"{', '.join(REQUIRED)} (GPU-seconds)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanError(f"costs file {path} is not valid JSON ({exc}); fix its syntax") from None
    if isinstance(data, dict) and isinstance(data.get("costs"), dict):
        data = data["costs"]
    if not isinstance(data, dict):
        raise PlanError(f"costs file {path}: the top level must be an object of fields, e.g. "
                        '{"explore_s_per_sample_step": 0.036, "regen_s_per_sample_step": 0.043, '
                        '"train_s_per_sample": 1.67}')
    known = {f.name for f in fields(Costs)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise PlanError(f"costs file {path}: unknown field {unknown[0]!r}; the fields are {', '.join(sorted(known))}")
    for name in REQUIRED:
        if name not in data:
            raise PlanError(f"costs file {path}: missing field {name!r} ({FIELD_HELP[name]}); add it, "
                            "e.g. from a run's measured phase times or from this tool's --json output")
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise PlanError(f"costs file {path}: {name} must be a finite number >= 0 (given {value!r}); "
                            f"it is {FIELD_HELP[name]}")
    return Costs(**{k: float(v) for k, v in data.items()})


def save_costs(costs: Costs, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(costs), indent=2) + "\n")


CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def read_preset(model: str) -> tuple[Shape, int, int, Mode, bool]:
    """The preset's iteration amounts, its explorer and learner counts, its mode and whether it streams
    regeneration (configs/<model>.yaml)."""
    from cluster.config.loading import load_config

    config = load_config(CONFIGS / f"{model}.yaml")
    explore = config.explore
    shape = Shape(prompts=config.prompts.per_iteration, candidates=config.prompts.candidates,
                  keep=config.prompts.keep, explore_steps=explore.steps or config.sampler.steps,
                  regen_steps=config.sampler.steps,
                  halving=(explore.halving_steps, explore.halving_survivors) if explore.schedule == "halving" else None)
    c = config.cluster
    return shape, c.explorers.count, c.learner.count, c.mode, c.stream_regeneration and c.mode == "sync"


# The formulas, on numbers.

def explore_group_s(costs: Costs, shape: Shape) -> float:
    """g: one prompt's exploration on one GPU, its sample-steps at c_x and its scored images at d."""
    return shape.explore_sample_steps() * costs.explore_s_per_sample_step \
        + shape.explore_scored() * costs.decode_reward_s_per_image


def regen_slot_s(costs: Costs, shape: Shape) -> float:
    """r: one prompt's regeneration on one learner, K images of S_r steps each, each decoded and scored."""
    return shape.keep * (shape.regen_steps * costs.regen_s_per_sample_step + costs.decode_reward_s_per_image)


def work(costs: Costs, shape: Shape) -> tuple[float, float, float]:
    """GPU-seconds per iteration: (W_x explore, W_r regenerate, W_t train)."""
    s = shape
    return (s.prompts * explore_group_s(costs, s), s.prompts * regen_slot_s(costs, s),
            s.prompts * s.keep * costs.train_s_per_sample)


def speedup(learners: int, efficiency: float) -> float:
    """u(L) = 1 + (L − 1)·e: each learner past the first adds e of a learner."""
    return 1 + (learners - 1) * efficiency


def learner_speedup(prompts: int, learners: int, efficiency: float) -> float:
    """u_P(L) = u(L) · (P/L) / ceil(P/L): L learner ranks over one learner, when each trains whole slots.
    Every rank waits for the busiest, which takes ceil(P/L) of the P slots (`slot_balance`, the rule of
    `owner_of`), each at u(L)/L of one learner's speed."""
    balance = slot_balance(prompts, learners)
    return speedup(learners, efficiency) * balance.ideal / balance.busiest


def rank_slowdown(learners: int, efficiency: float) -> float:
    """L / u(L): how much longer one slot takes on a rank of a group of L than on a lone learner."""
    return learners / speedup(learners, efficiency)


def explore_wall(prompts: int, group_s: float, explorers: int) -> float:
    """X(E) = ceil(P / E) · g: explorer s mod E explores slot s (the pool's `submit`), one group at a time."""
    return math.ceil(prompts / explorers) * group_s


def streamed_regen_end(prompts: int, explorers: int, learners: int, group_s: float, regen_group_s: float) -> float:
    """When the last learner rank finishes regenerating, each taking its groups as they arrive.

    Slot s's group arrives at (floor(s / E) + 1) · g (explorer s mod E explores its slots in order) and goes
    to rank `owner_of(s, P, L)`, which regenerates its groups one at a time in arrival order, regen_group_s
    each (one group on one rank). Arrivals rise with s, so slot order is each rank's arrival order."""
    free = [0.0] * learners  # when each rank has regenerated everything sent to it so far
    for slot in range(prompts):
        rank = owner_of(slot, prompts, learners)
        free[rank] = max(free[rank], (slot // explorers + 1) * group_s) + regen_group_s
    return max(free)


def colocated_s(costs: Costs, shape: Shape, gpus: int, efficiency: float = 1.0) -> float:
    """The paper's layout: all G GPUs do each phase in turn."""
    w_x, w_r, w_t = work(costs, shape)
    return w_x / gpus + (w_r + w_t) / speedup(gpus, efficiency) + costs.sync_s + costs.overhead_s


def colocated_actors_s(costs: Costs, shape: Shape, gpus: int, efficiency: float = 1.0) -> float:
    """The colocated layout as this project runs it: G explorers and G learner ranks sharing G GPUs, both
    taking whole prompt slots."""
    _, w_r, w_t = work(costs, shape)
    group = explore_group_s(costs, shape)
    return explore_wall(shape.prompts, group, gpus) + (w_r + w_t) / learner_speedup(shape.prompts, gpus, efficiency) \
        + costs.sync_s + costs.overhead_s


@dataclass(frozen=True)
class Layout:
    explorers: int
    learners: int
    mode: Mode
    streamed: bool
    seconds: float
    explorer_idle: float
    learner_idle: float

    @property
    def name(self) -> str:
        return f"{self.explorers}E+{self.learners}L"

    @property
    def mode_name(self) -> str:
        return f"{self.mode}{', streamed' if self.streamed else ''}"


def split_s(costs: Costs, shape: Shape, explorers: int, learners: int, mode: Mode, streamed: bool,
            efficiency: float = 1.0) -> float:
    """Iteration seconds of E explorers + L learners (the formulas of the module docstring): both sides
    count whole slots, the busiest explorer's ceil(P/E) groups and the busiest learner rank's ceil(P/L)."""
    _, w_r, w_t = work(costs, shape)
    group = explore_group_s(costs, shape)
    u = learner_speedup(shape.prompts, learners, efficiency)
    x, train = explore_wall(shape.prompts, group, explorers), w_t / u
    if mode == "async":
        return max(x, w_r / u + train + costs.sync_s) + costs.overhead_s
    if streamed:
        # One group on its rank. Exact at e = 1 for groups of equal cost forwarded at once; at e < 1 the
        # group's loss is spread evenly over its ranks (L/u(L) each), an approximation as in the other modes.
        regen_group = regen_slot_s(costs, shape) * rank_slowdown(learners, efficiency)
        return streamed_regen_end(shape.prompts, explorers, learners, group, regen_group) + train + costs.sync_s \
            + costs.overhead_s
    return x + w_r / u + train + costs.sync_s + costs.overhead_s


def layout(costs: Costs, shape: Shape, explorers: int, learners: int, mode: Mode, streamed: bool,
           efficiency: float = 1.0) -> Layout:
    w_x, w_r, w_t = work(costs, shape)
    t = split_s(costs, shape, explorers, learners, mode, streamed, efficiency)
    return Layout(explorers, learners, mode, streamed, t, 1 - w_x / (explorers * t), 1 - (w_r + w_t) / (learners * t))


def check_gpus(gpus: int) -> None:
    if gpus < 2:
        raise PlanError(f"--gpus {gpus}: a split needs at least 2 GPUs (1 explorer + 1 learner); "
                        "pass --gpus 2 or more")


def check_efficiency(efficiency: float) -> None:
    if not 0 < efficiency <= 1:
        raise PlanError(f"--learner-efficiency {efficiency}: must be in (0, 1]; 1 is perfect data parallelism")


VARIANTS: tuple[tuple[Mode, bool], ...] = (("sync", False), ("sync", True), ("async", False))


def all_layouts(costs: Costs, shape: Shape, gpus: int, efficiency: float = 1.0) -> list[Layout]:
    """Every split E + L = G (E, L ≥ 1) in every mode; async streamed equals async and is left out."""
    check_gpus(gpus)
    check_efficiency(efficiency)
    return [layout(costs, shape, e, gpus - e, mode, streamed, efficiency)
            for mode, streamed in VARIANTS for e in range(1, gpus)]


def best_split(costs: Costs, shape: Shape, gpus: int, mode: Mode, streamed: bool, efficiency: float = 1.0) -> Layout:
    """The fastest split in one mode (ties: the fewer explorers). Every split is tried: both sides fall in
    steps of whole slots, ceil(P/E) and ceil(P/L), and at e < 1 the learners' side rises between its steps
    (another rank, the same busiest rank's slots, each rank slower), so no side is monotone enough to
    bisect on. G − 1 splits, each O(P) at most."""
    check_gpus(gpus)
    check_efficiency(efficiency)
    candidates = [layout(costs, shape, e, gpus - e, mode, streamed, efficiency) for e in range(1, gpus)]
    return min(candidates, key=lambda c: (c.seconds, c.explorers))


def plan(costs: Costs, shape: Shape, gpus: int, efficiency: float = 1.0) -> dict[str, Any]:
    """Every layout, the best per mode, and the colocated reference, as the JSON output holds them."""
    layouts = all_layouts(costs, shape, gpus, efficiency)
    reference = colocated_s(costs, shape, gpus, efficiency)
    w_x, w_r, w_t = work(costs, shape)
    colocated_idle = 1 - (w_x + w_r + w_t) / (gpus * reference)
    best = {f"{m}{'_streamed' if s else ''}": best_split(costs, shape, gpus, m, s, efficiency) for m, s in VARIANTS}
    row = lambda c: {**asdict(c), "vs_colocated": c.seconds / reference,  # noqa: E731
                     "learner_slots": asdict(slot_balance(shape.prompts, c.learners))}
    return {"gpus": gpus, "shape": asdict(shape), "costs": asdict(costs), "learner_efficiency": efficiency,
            "colocated_s": reference, "colocated_idle": colocated_idle,
            "colocated_actors_s": colocated_actors_s(costs, shape, gpus, efficiency),
            "layouts": [row(c) for c in layouts], "best": {k: row(c) for k, c in best.items()}}


def format_table(result: dict[str, Any]) -> str:
    reference, idle = result["colocated_s"], result["colocated_idle"]
    lines = ["| split | mode | iteration s | vs colocated | explorers idle | learners idle |",
             "|---|---|---|---|---|---|",
             f"| colocated {result['gpus']} GPUs | sync | {reference:.1f} | 1.00 | {idle:.0%} | {idle:.0%} |"]
    for c in result["layouts"]:
        mode = f"{c['mode']}{', streamed' if c['streamed'] else ''}"
        lines.append(f"| {c['explorers']}E+{c['learners']}L | {mode} | {c['seconds']:.1f} | {c['vs_colocated']:.2f} | "
                     f"{c['explorer_idle']:.0%} | {c['learner_idle']:.0%} |")
    lines.append("")
    for key, c in result["best"].items():
        verdict = "beats" if c["seconds"] < reference - 1e-9 else "matches" if c["seconds"] <= reference + 1e-9 \
            else "is slower than"
        lines.append(f"best {key.replace('_', ' ')}: {c['explorers']}E+{c['learners']}L, {c['seconds']:.1f} s "
                     f"({c['vs_colocated']:.2f}×): {verdict} colocated ({reference:.1f} s)")
    prompts = result["shape"]["prompts"]
    for learners in sorted({c["learners"] for c in result["best"].values()}):
        keys = [k.replace("_", " ") for k, c in result["best"].items() if c["learners"] == learners]
        lines.append(f"learner slots of best {', '.join(keys)} (counted in the seconds above): "
                     f"{slot_balance(prompts, learners).describe()}")
    g, t = result["gpus"], result["colocated_actors_s"]
    lines.append(f"colocated on this project's actors ({g} explorers + {g} learner ranks, half a GPU each, sync): "
                 f"{t:.1f} s ({t / reference:.2f}×); cluster.explorers {{count: {g}, num_gpus: 0.5}}, "
                 f"cluster.learner {{count: {g}, num_gpus: 0.5}}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, required=True, help="GPUs in the job (explorers + learners)")
    parser.add_argument("--model", choices=MODELS + ESTIMATED_MODELS, default="sd35_large",
                        help="preset (its prompts, N, K, steps) and the paper's costs for it")
    parser.add_argument("--costs", type=Path, default=None, help="JSON of measured costs instead of the paper's")
    parser.add_argument("--learner-efficiency", type=float, default=1.0,
                        help="share of a learner each learner past the first adds (1: perfect data parallelism)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        costs = load_costs(args.costs) if args.costs is not None else paper_costs(args.model)
        shape, preset_explorers, preset_learners, preset_mode, preset_streamed = read_preset(args.model)
        result = plan(costs, shape, args.gpus, args.learner_efficiency)
    except PlanError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    result["model"] = args.model
    result["costs_source"] = "file" if args.costs is not None else (
        "SD3.5-L's Table 5 scaled by transformer parameters (an estimate)" if args.model in ESTIMATED_MODELS
        else "paper Table 5")
    print(f"{args.model}, {args.gpus} GPUs, costs from {result['costs_source']}")
    note = measured_note(costs) if args.costs is not None else (
        f"prices (GPU-s): c_x {costs.explore_s_per_sample_step:.4g}/step, c_r {costs.regen_s_per_sample_step:.4g}"
        f"/step, c_t {costs.train_s_per_sample:.4g}/sample, d {costs.decode_reward_s_per_image:.4g}/image "
        "(decode + reward: the midpoint of the range Table 5 allows" + (", scaled from SD3.5-L's"
                                                                         if args.model != "sd35_large" else "")
        + ", bench.prices)")
    if note:
        print(note)
    print(format_table(result))
    if preset_explorers + preset_learners == args.gpus:
        preset = layout(costs, shape, preset_explorers, preset_learners, preset_mode, preset_streamed,
                        args.learner_efficiency)
        balance = slot_balance(shape.prompts, preset.learners)
        result["preset"] = {**asdict(preset), "vs_colocated": preset.seconds / result["colocated_s"],
                            "learner_slots": asdict(balance)}
        said = any(c["learners"] == preset.learners for c in result["best"].values())
        print(f"the preset's layout ({preset.name}, {preset.mode_name}): {preset.seconds:.1f} s "
              f"({result['preset']['vs_colocated']:.2f}× colocated); "
              + ("its learner slots as above" if said else f"learner slots: {balance.describe()}"))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
