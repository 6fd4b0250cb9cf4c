"""The price table (`bench.prices`): its derivation from Table 5 at every decode + reward price of the bracket,
the numbers its docstring states, and one table for the plan and the convergence benchmark."""

from __future__ import annotations

import pytest

from bench import prices
from bench.plan import PAPER_SHAPE, paper_costs, work
from bench.prices import (
    COUNTERS,
    D_DEFAULT,
    D_HIGH,
    D_LOW,
    PRICES,
    PRICES_HIGH_D,
    PRICES_LOW_D,
    Costs,
    counter_prices,
    fp4_ratio_at,
    measured_note,
    naive_step_s,
    paper_model_costs,
    prices_at,
    scaled_model_costs,
    score_price_at,
    sd35_costs,
)
from learner.iteration_record import COUNTED_WORK

BRACKET = (D_LOW, D_DEFAULT, D_HIGH)


def paper_iteration(scored_pool: int = 96) -> dict[str, float]:
    """One Sol-RL iteration of the paper's shape as counted work: 48 prompts, 96 × 6 FP4 steps, 24 × 10
    regenerated, 24 × 6 trained timesteps × 5 passes; every explored and regenerated image scored once."""
    return {"fp_sample_steps": 48 * 24 * 10, "fp_pool_sample_steps": 0, "lp_sample_steps": 48 * 96 * 6,
            "train_passes": 48 * 24 * 6 * 5, "scored_images": 48 * (scored_pool + 24)}


def gpu_s(work: dict[str, float], table: dict[str, float]) -> float:
    return sum(work[k] * table[k] for k in table)


def test_the_docstrings_numbers() -> None:
    per_image = (prices.EXPLORE_IMAGE_S, prices.REGEN_IMAGE_S, prices.NAIVE_IMAGE_S)
    assert per_image == pytest.approx((1000 / 4608, 496 / 1152, 3608 / 4608))
    assert per_image == pytest.approx((0.217014, 0.430556, 0.782986), abs=1e-6)
    train, high, default = prices.TRAIN_SAMPLE_S, D_HIGH, D_DEFAULT
    assert train == pytest.approx(1920 / 1152)
    assert high == pytest.approx(1147 / 9792) and high == pytest.approx(0.117136, abs=1e-6)
    assert default == pytest.approx(0.058568, abs=1e-6)
    assert fp4_ratio_at(D_LOW) == pytest.approx(0.4619, abs=1e-4)  # the paper's quoted 0.46
    assert fp4_ratio_at(D_DEFAULT) == pytest.approx(0.3645, abs=1e-4)
    assert fp4_ratio_at(D_HIGH) == pytest.approx(0.25)
    assert score_price_at(fp4_ratio_at(D_DEFAULT)) == pytest.approx(D_DEFAULT)
    table = {D_LOW: (0.078299, 0.036169, 0.043056), D_DEFAULT: (0.072442, 0.026408, 0.037199),
             D_HIGH: (0.066585, 0.016646, 0.031342)}
    for d, (c_b, c_x, c_r) in table.items():
        costs = sd35_costs(d)
        assert (naive_step_s(d), costs.explore_s_per_sample_step, costs.regen_s_per_sample_step) == pytest.approx(
            (c_b, c_x, c_r), abs=1e-6)


@pytest.mark.parametrize("d", BRACKET)
def test_every_d_of_the_bracket_reproduces_table_5(d: float) -> None:
    """The three phases Table 5 measures, and its naive rollout, to the GPU-second on 8 GPUs."""
    costs, table = sd35_costs(d), prices_at(d)
    assert 4608 * (6 * costs.explore_s_per_sample_step + d) == pytest.approx(125 * 8)
    assert 1152 * (10 * costs.regen_s_per_sample_step + d) == pytest.approx(62 * 8)
    assert 4608 * (10 * naive_step_s(d) + d) == pytest.approx(451 * 8)
    assert 1152 * costs.train_s_per_sample == pytest.approx(240 * 8)
    assert gpu_s(paper_iteration(), table) == pytest.approx((125 + 62 + 240) * 8)
    naive = {**paper_iteration(), "fp_sample_steps": 0, "fp_pool_sample_steps": 48 * 96 * 10, "lp_sample_steps": 0,
             "scored_images": 48 * 96}
    assert gpu_s(naive, table) == pytest.approx((451 + 240) * 8)
    assert tuple(x / 8 for x in work(paper_costs("sd35_large", d), PAPER_SHAPE)) == pytest.approx((125, 62, 240))


def test_the_named_tables_are_the_bracket() -> None:
    assert prices_at(D_DEFAULT) == PRICES and prices_at(0.0) == PRICES_LOW_D and prices_at(D_HIGH) == PRICES_HIGH_D
    assert PRICES_LOW_D["scored_images"] == 0.0 and PRICES_HIGH_D["scored_images"] == D_HIGH
    assert PRICES_LOW_D["lp_sample_steps"] / PRICES_LOW_D["fp_pool_sample_steps"] == pytest.approx(0.462, abs=1e-3)
    assert all(t["train_passes"] == pytest.approx(1.6666667 / 30) for t in (PRICES, PRICES_LOW_D, PRICES_HIGH_D))
    with pytest.raises(ValueError, match="must lie in"):
        prices_at(-0.01)
    with pytest.raises(ValueError, match="must lie in"):
        prices_at(prices.EXPLORE_IMAGE_S)


def test_every_counted_work_field_has_a_price() -> None:
    assert COUNTERS == COUNTED_WORK
    assert tuple(PRICES) == COUNTERS and tuple(counter_prices(Costs(1.0, 2.0, 3.0))) == COUNTERS


def test_successive_halving_pays_for_the_images_it_scores() -> None:
    """Per prompt: N·f + M·(S − f) FP4 steps and N + M images against the fixed pass's N·S and N."""
    def explore(steps: int, scored: int, d: float) -> float:
        return steps * prices_at(d)["lp_sample_steps"] + scored * d

    fixed = [explore(96 * 6, 96, d) for d in BRACKET]
    assert fixed == pytest.approx([1000 / 48] * 3)  # the fixed pass does not depend on d
    halving = [explore(96 * 2 + 48 * 4, 96 + 48, d) / f for d, f in zip(BRACKET, fixed, strict=True)]
    assert halving == pytest.approx([0.667, 0.892, 1.116], abs=1e-3)  # d = 0 was the only case it saved 1/3


@pytest.mark.parametrize(("model", "naive_s", "rollout_s"), [("flux_dev", 274.0, 169.0), ("sana_1600m", 95.0, 76.0)])
@pytest.mark.parametrize("d", BRACKET)
def test_flux_and_sana_keep_their_rollout_totals_at_every_d(model: str, naive_s: float, rollout_s: float,
                                                            d: float) -> None:
    costs, scale = paper_model_costs(model, d), naive_s / 451
    w_x, w_r, w_t = work(costs, PAPER_SHAPE)
    assert (w_x + w_r) / 8 == pytest.approx(rollout_s)
    assert (w_r / 8, w_t / 8) == pytest.approx((62 * scale, 240 * scale))
    assert costs.decode_reward_s_per_image == pytest.approx(d * scale)
    if d == D_LOW:  # the step prices the plan had before d was separated
        assert (costs.explore_s_per_sample_step, costs.regen_s_per_sample_step) == pytest.approx(
            {"flux_dev": (0.03800, 0.02616), "sana_1600m": (0.01821, 0.00907)}[model], abs=1e-5)


def test_qwen_image_is_priced_as_sd35_large_scaled_by_its_transformers_parameters() -> None:
    """The parameter counts are those of the published configs (built on the meta device); the steps and the
    training scale by their ratio, decode + reward does not; the phases keep SD3.5-L's shares otherwise."""
    import diffusers
    import torch

    from bench.memory import SD35_LARGE

    with torch.device("meta"):
        counted = {"sd35_large": diffusers.SD3Transformer2DModel(**SD35_LARGE),
                   "qwen_image": diffusers.QwenImageTransformer2DModel()}
    assert {k: sum(t.numel() for t in m.state_dict().values()) for k, m in counted.items()} == prices.TRANSFORMER_PARAMS
    scale = prices.TRANSFORMER_PARAMS["qwen_image"] / prices.TRANSFORMER_PARAMS["sd35_large"]
    assert scale == pytest.approx(2.508, abs=1e-3)
    for d in BRACKET:
        qwen, sd35 = scaled_model_costs("qwen_image", d), sd35_costs(d)
        assert (qwen.explore_s_per_sample_step, qwen.regen_s_per_sample_step, qwen.train_s_per_sample) == \
            pytest.approx((sd35.explore_s_per_sample_step * scale, sd35.regen_s_per_sample_step * scale,
                           sd35.train_s_per_sample * scale))
        assert qwen.decode_reward_s_per_image == d
    assert paper_costs("qwen_image") == scaled_model_costs("qwen_image")


def test_a_measured_file_without_d_says_so() -> None:
    assert "d = 0" in measured_note(Costs(0.1, 0.2, 3.0))
    assert measured_note(Costs(0.1, 0.2, 3.0, decode_reward_s_per_image=0.05)) is None
