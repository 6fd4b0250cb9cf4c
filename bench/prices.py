"""The price table of modeled GPU time: every piece of counted work, in GPU-seconds, decided here once.

One GPU busy for one second is one GPU-second. `bench.plan` prices an iteration's phases with it and
`bench.convergence` a run's counted work (`learner.iteration_record.Work`); `--costs FILE` (measured
costs) replaces it in both.

    c_r  regen_s_per_sample_step     a full-precision denoising step of one kept sample (regeneration, K-in-K)
    c_b  (pool step)                 a full-precision denoising step of one pool sample (naive scaling's N)
    c_x  explore_s_per_sample_step   a low-precision denoising step of one sample (any pool, any pass)
    c_t  train_s_per_sample          training on one kept sample; a training pass is c_t / (6 timesteps ·
                                     5 passes): SD3.5-L's timestep fraction, each trained timestep θ forward +
                                     backward (3 passes), θ_old and the reference (1 each)
    d    decode_reward_s_per_image   decoding one image and scoring it with the reward, the same in any
                                     precision (the VAE and the reward model are not quantized)

Every image a rollout makes is decoded and scored once, whatever its steps: a pool of N at S steps costs
N·S·(step) + N·d; successive halving (`learner.rollouts.successive_halving`) scores every seed at its cut
and the M survivors again at the end, N + M images. Step prices without d would hide that work in the
steps, amortized over the paper's step counts, and make it free for anything that scores more per step.

Derivation, from the Sol-RL paper's Table 5 (SD3.5-Large, 8 GPUs, every GPU on each phase, synchronous;
P = 48 prompts, N = 96 candidates, K = 24 kept, S_x = 6 explore steps, S_r = 10 regeneration steps), per
image in GPU-seconds (seconds · 8 GPUs / images):

    explore     125 s: 48·96 = 4608 images at 6 FP4 steps     1000 / 4608 = 0.217014 = 6·c_x + d
    regenerate   62 s: 48·24 = 1152 images at 10 BF16 steps    496 / 1152 = 0.430556 = 10·c_r + d
    naive        451 s: 4608 images at 10 BF16 steps            3608 / 4608 = 0.782986 = 10·c_b + d
    train        240 s: 1152 kept samples                       1920 / 1152 = c_t = 1.666667 (a pass 0.055556)

Three equations for four unknowns: Table 5 alone does not identify d. Explore and naive sample the same
96-image pools (the same decoding and scoring), so the FP4 step ratio q = c_x / c_b fixes it:
d = B − 10·(B − E)/(10 − 6·q), with E = 0.217014 and B = 0.782986. The bracket:

    d = 0            q = 0.4619 (the paper's quoted 0.46: every step price includes its image's decode
                     and reward)
    q = 1/4          NVFP4's ideal 4× over BF16: 8.5·c_b = B − E = 0.565972, c_b = 0.066585,
                     d = 0.117136 (= 1147/9792)

The default is the bracket's midpoint, d = 0.058568; c_x, c_r and c_b follow from it by the identities
above, so at any d of the bracket the table prices the paper's iteration to Table 5 exactly (explore
1000, regenerate 496, naive rollout 3608, train 1920 GPU-seconds on 8 GPUs):

    d (GPU-s/image)      c_b        c_x        c_r        q = c_x/c_b
    0         (LOW)      0.078299   0.036169   0.043056   0.4619
    0.058568  (default)  0.072442   0.026408   0.037199   0.3645
    0.117136  (HIGH)     0.066585   0.016646   0.031342   0.2500

What d changes, per prompt at the paper's shape (GPU-s; LOW / default / HIGH): the fixed explore pass
20.83 at every d; successive halving from 2 steps (96·2 + 48·4 steps, 144 images) 13.89 / 18.57 / 23.26
(0.67× / 0.89× / 1.12× the fixed pass), from 3 steps 15.63 / 19.84 / 24.06 (0.75× / 0.95× / 1.15×);
96 FP4 images at 2 explore steps 6.94 / 10.69 / 14.44; naive quantization's 96 FP4 images at 10 steps
34.72 / 30.97 / 27.23. K-in-K (10.33), Sol-RL's regeneration, naive scaling and training do not depend
on d. `PRICES_LOW_D` and `PRICES_HIGH_D` (`prices_at(d)`) give a report the sensitivity.

FLUX.1-dev and SANA 1.6B (`paper_model_costs`): Table 5 gives only their rollout totals (naive 274 s →
Sol-RL 169 s for FLUX, 95 s → 76 s for SANA). Assumed: c_r, c_t and d are SD3.5-L's multiples of the naive
per-image cost (the naive rollout ratio, 274/451 and 95/451, scales all three); c_x takes the rest of the
Sol-RL rollout: 6·c_x + d = (rollout·8/48 − 24·(10·c_r + d)) / 96.

Qwen-Image (`scaled_model_costs`, beyond the paper): no published timings. Estimated: at SD3.5-L's
resolution (1024 px, 4096 image tokens for both) a step and a training pass cost SD3.5-L's times the ratio
of the transformers' parameters (20.43B / 8.15B = 2.508: the Linears, which dominate an MMDiT's FLOPs,
scale with them; attention's smaller share does not, so this is an estimate); d stays SD3.5-L's (the VAE
decode and the reward are outside the transformer). The split `bench.plan` finds depends on the phases'
ratios, which this keeps; the times are estimates to be replaced by `--costs` from a run.
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER_GPUS = 8
PAPER_PROMPTS, PAPER_CANDIDATES, PAPER_KEEP = 48, 96, 24  # P, N, K
PAPER_EXPLORE_STEPS, PAPER_REGEN_STEPS = 6, 10  # S_x (FP4), S_r (BF16)
# Table 5, seconds per iteration on 8 GPUs: the naive BF16 rollout and Sol-RL's rollout (explore + regenerate).
PAPER_ROLLOUT_S = {"sd35_large": (451.0, 187.0), "flux_dev": (274.0, 169.0), "sana_1600m": (95.0, 76.0)}
SD35_PHASES_S = {"explore": 125.0, "regen": 62.0, "train": 240.0}
PAPER_COLOCATED_S = 427.0  # SD3.5-L, Sol-RL end to end
TRAIN_PASSES_PER_SAMPLE = 6 * 5  # trained timesteps × passes each (θ forward + backward 3, θ_old 1, reference 1)

# GPU-seconds per image of each SD3.5-L phase, decode and reward included
EXPLORE_IMAGE_S = SD35_PHASES_S["explore"] * PAPER_GPUS / (PAPER_PROMPTS * PAPER_CANDIDATES)  # 6·c_x + d
REGEN_IMAGE_S = SD35_PHASES_S["regen"] * PAPER_GPUS / (PAPER_PROMPTS * PAPER_KEEP)  # 10·c_r + d
NAIVE_IMAGE_S = PAPER_ROLLOUT_S["sd35_large"][0] * PAPER_GPUS / (PAPER_PROMPTS * PAPER_CANDIDATES)  # 10·c_b + d
TRAIN_SAMPLE_S = SD35_PHASES_S["train"] * PAPER_GPUS / (PAPER_PROMPTS * PAPER_KEEP)  # c_t
IDEAL_FP4_RATIO = 0.25  # NVFP4's 4× over BF16: the bracket's upper end of d


def score_price_at(fp4_ratio: float) -> float:
    """d when an FP4 step costs `fp4_ratio` of a BF16 step: d = B − S_r·(B − E)/(S_r − q·S_x)."""
    return NAIVE_IMAGE_S - PAPER_REGEN_STEPS * (NAIVE_IMAGE_S - EXPLORE_IMAGE_S) / (
        PAPER_REGEN_STEPS - fp4_ratio * PAPER_EXPLORE_STEPS)


def fp4_ratio_at(d: float) -> float:
    """q = c_x / c_b at decode + reward price d (0.4619 at d = 0, the paper's quoted 0.46)."""
    return ((EXPLORE_IMAGE_S - d) / PAPER_EXPLORE_STEPS) / ((NAIVE_IMAGE_S - d) / PAPER_REGEN_STEPS)


D_LOW = 0.0
D_HIGH = score_price_at(IDEAL_FP4_RATIO)  # 0.117136
D_DEFAULT = (D_LOW + D_HIGH) / 2  # 0.058568


@dataclass(frozen=True)
class Costs:
    """Per-phase costs in GPU-seconds; sync_s and overhead_s are wall seconds per iteration. A measured
    file without decode_reward_s_per_image has d = 0: its step prices include each image's decode and
    reward, as `cluster.reports.run_costs` measures them."""

    explore_s_per_sample_step: float
    regen_s_per_sample_step: float
    train_s_per_sample: float
    sync_s: float = 0.0
    overhead_s: float = 0.0
    decode_reward_s_per_image: float = 0.0


def _check_d(d: float) -> None:
    if not 0 <= d < EXPLORE_IMAGE_S:
        raise ValueError(f"decode + reward price d = {d!r}: must lie in [0, {EXPLORE_IMAGE_S:.6f}) GPU-s, below "
                         "the explore pass's whole per-image cost (the bracket is [0, "
                         f"{D_HIGH:.6f}])")


def sd35_costs(d: float = D_DEFAULT) -> Costs:
    """SD3.5-L's per-phase costs at decode + reward price d (the module docstring's identities)."""
    _check_d(d)
    return Costs(explore_s_per_sample_step=(EXPLORE_IMAGE_S - d) / PAPER_EXPLORE_STEPS,
                 regen_s_per_sample_step=(REGEN_IMAGE_S - d) / PAPER_REGEN_STEPS,
                 train_s_per_sample=TRAIN_SAMPLE_S, decode_reward_s_per_image=d)


def naive_step_s(d: float = D_DEFAULT) -> float:
    """c_b: SD3.5-L's BF16 step of a pool sample (the naive rollout's) at decode + reward price d."""
    _check_d(d)
    return (NAIVE_IMAGE_S - d) / PAPER_REGEN_STEPS


def paper_model_costs(model: str, d: float = D_DEFAULT) -> Costs:
    """A Table 5 model's costs at SD3.5-L's decode + reward price d (scaled for FLUX and SANA: the module
    docstring). Raises KeyError for a model Table 5 does not cover."""
    naive_s, rollout_s = PAPER_ROLLOUT_S[model]
    if model == "sd35_large":
        return sd35_costs(d)
    sd35 = sd35_costs(d)
    scale = naive_s / PAPER_ROLLOUT_S["sd35_large"][0]
    d_model, regen = d * scale, sd35.regen_s_per_sample_step * scale
    regen_image = PAPER_REGEN_STEPS * regen + d_model
    explore_image = (rollout_s * PAPER_GPUS / PAPER_PROMPTS - PAPER_KEEP * regen_image) / PAPER_CANDIDATES
    return Costs(explore_s_per_sample_step=(explore_image - d_model) / PAPER_EXPLORE_STEPS,
                 regen_s_per_sample_step=regen, train_s_per_sample=TRAIN_SAMPLE_S * scale,
                 decode_reward_s_per_image=d_model)


# Transformer parameters, counted on the published configs built on the meta device (tests/bench/test_prices.py).
TRANSFORMER_PARAMS = {"sd35_large": 8_146_280_768, "qwen_image": 20_430_401_088}


def scaled_model_costs(model: str, d: float = D_DEFAULT) -> Costs:
    """A model beyond Table 5 at 1024 px: SD3.5-L's step and training prices × its transformer's parameters ÷
    SD3.5-L's, d unscaled (the module docstring). Raises KeyError for a model without a parameter count."""
    sd35, scale = sd35_costs(d), TRANSFORMER_PARAMS[model] / TRANSFORMER_PARAMS["sd35_large"]
    return Costs(explore_s_per_sample_step=sd35.explore_s_per_sample_step * scale,
                 regen_s_per_sample_step=sd35.regen_s_per_sample_step * scale,
                 train_s_per_sample=sd35.train_s_per_sample * scale, decode_reward_s_per_image=d)


# The counted work (`learner.iteration_record.Work`, whose fields these are) and its prices.
COUNTERS = ("fp_sample_steps", "fp_pool_sample_steps", "lp_sample_steps", "train_passes", "scored_images")


def counter_prices(costs: Costs, pool_step_s: float | None = None) -> dict[str, float]:
    """GPU-seconds per unit of each counter: a kept sample's full-precision step c_r, a pool sample's
    `pool_step_s` (c_b; None: priced as c_r, what a measured file has), a low-precision step c_x, a
    training pass c_t / 30, a scored image d."""
    return {"fp_sample_steps": costs.regen_s_per_sample_step,
            "fp_pool_sample_steps": costs.regen_s_per_sample_step if pool_step_s is None else pool_step_s,
            "lp_sample_steps": costs.explore_s_per_sample_step,
            "train_passes": costs.train_s_per_sample / TRAIN_PASSES_PER_SAMPLE,
            "scored_images": costs.decode_reward_s_per_image}


def prices_at(d: float = D_DEFAULT) -> dict[str, float]:
    """The paper's SD3.5-L prices per counter at decode + reward price d."""
    return counter_prices(sd35_costs(d), naive_step_s(d))


PRICES = prices_at(D_DEFAULT)
PRICES_LOW_D = prices_at(D_LOW)  # d = 0: the step prices carry the decode and reward (q = 0.46)
PRICES_HIGH_D = prices_at(D_HIGH)  # q = 1/4


def measured_note(costs: Costs) -> str | None:
    """The one line a measured costs file without a decode + reward price gets; None when it has one."""
    if costs.decode_reward_s_per_image:
        return None
    return ("decode + reward per image d = 0 (no decode_reward_s_per_image in the costs file): its step prices "
            "must include each image's decode and reward")
