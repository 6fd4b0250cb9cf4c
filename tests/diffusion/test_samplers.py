"""Seeds, noise and the ODE samplers: exact solutions, convergence order, replay across processes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from diffusion.noise import candidate_seeds, derive_seed, initial_noise
from diffusion.samplers import flow_sigmas, sample_ode


def test_derive_seed_is_a_pure_function_of_its_arguments():
    assert derive_seed(0, 1, 2, 3) == derive_seed(0, 1, 2, 3)
    variants = {derive_seed(0, 1, 2, 3), derive_seed(1, 1, 2, 3), derive_seed(0, 2, 2, 3),
                derive_seed(0, 1, 3, 3), derive_seed(0, 1, 2, 4), derive_seed(0, 2, 1, 3)}
    assert len(variants) == 6
    seeds = candidate_seeds(7, 0, 0, 1000)
    assert len(set(seeds)) == 1000 and all(0 <= s < 2**63 for s in seeds)


def test_noise_rows_depend_on_their_seed_alone():
    batch = initial_noise([5, 6, 7], (1, 4, 4))
    alone = initial_noise([6], (1, 4, 4))
    assert torch.equal(batch[1], alone[0])
    assert not torch.equal(batch[0], batch[1])


def test_flow_sigmas_match_diffusers_shifted_schedule():
    sigmas = flow_sigmas(10, shift=3.0)
    assert sigmas.shape == (11,) and sigmas.dtype == torch.float32
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0 and bool((sigmas[1:] < sigmas[:-1]).all())
    # the SD3 shift σ' = sσ/(1+(s−1)σ) lifts every interior σ above the unshifted grid
    assert bool((sigmas[1:-1] > flow_sigmas(10, shift=1.0)[1:-1]).all())


def _gaussian_velocity(mean: float, std: float):
    """Exact velocity of rectified flow for data x0 ~ N(mean, std²) per dimension.

    x_σ = (1−σ)x0 + σε has mean m_σ = (1−σ)·mean and variance s_σ² = (1−σ)²std² + σ²;
    the ODE keeps the standardized coordinate, so v = −mean + (σ − (1−σ)std²)/s_σ² · (x − m_σ).
    """

    def velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        s = sigma.view(-1, *([1] * (x.dim() - 1))).double()
        var = (1 - s) ** 2 * std**2 + s**2
        return (-mean + (s - (1 - s) * std**2) / var * (x.double() - (1 - s) * mean)).float()

    return velocity


@pytest.mark.parametrize("solver", ["euler", "dpm2"])
def test_point_mass_data_is_solved_exactly(solver):
    target = torch.tensor([0.3, -0.7, 1.2])

    def velocity(x, sigma):  # data = a single point: v = (x − x0)/σ
        return (x - target) / sigma.view(-1, 1)

    noise = initial_noise([1, 2], (3,))
    out = sample_ode(velocity, noise, flow_sigmas(3, shift=2.0), solver).x0
    torch.testing.assert_close(out, target.expand(2, 3), atol=1e-6, rtol=0)


def test_convergence_order_euler_first_dpm2_second():
    mean, std = 0.5, 0.2
    noise = initial_noise(list(range(64)), (4,))
    exact = mean + std * noise  # the ODE maps x_1 = ε to mean + std·ε
    velocity = _gaussian_velocity(mean, std)

    def error(solver: str, steps: int) -> float:
        grid = torch.linspace(1.0, 0.0, steps + 1)  # uniform: no σ_min tail, so orders show cleanly
        return (sample_ode(velocity, noise, grid, solver).x0 - exact).abs().max().item()

    euler_ratio = error("euler", 20) / error("euler", 40)
    dpm_ratio = error("dpm2", 20) / error("dpm2", 40)
    assert 1.6 < euler_ratio < 2.5, euler_ratio  # first order: halving h halves the error
    assert dpm_ratio > 3.0, dpm_ratio  # second order: about a quarter


def test_sampler_returns_the_visited_states():
    velocity = _gaussian_velocity(0.0, 0.5)
    noise = initial_noise([3], (2,))
    result = sample_ode(velocity, noise, flow_sigmas(5), "euler", return_states=True)
    assert len(result.states) == 6
    assert torch.equal(result.states[0], noise) and torch.equal(result.states[-1], result.x0)


def test_unknown_solver_is_refused():
    with pytest.raises(ValueError, match=r"unknown solver 'heun'.*euler, dpm2"):
        sample_ode(lambda x, s: x, torch.zeros(1, 2), flow_sigmas(2), "heun")  # type: ignore[arg-type]


def test_embedded_dpm2_beats_euler_against_a_fine_step_reference(embedded_policy):
    prompts = ["a handwritten digit three"] * 8
    seeds = candidate_seeds(0, 0, 0, 8)
    reference = embedded_policy.sample(prompts, seeds, steps=200, solver="euler").x0
    for steps in (6, 10, 20):  # at ≤ 4 steps dpm2 degenerates to Euler (first-order ends)
        euler = embedded_policy.sample(prompts, seeds, steps=steps, solver="euler").x0
        dpm = embedded_policy.sample(prompts, seeds, steps=steps, solver="dpm2").x0
        assert (dpm - reference).pow(2).mean() < (euler - reference).pow(2).mean(), steps


_REPLAY = """
import sys, torch
from safetensors.torch import save_file
from diffusion.loading import load_policy
from diffusion.config import EMBEDDED_MODEL
from diffusion.noise import candidate_seeds, initial_noise
torch.set_num_threads(1)
policy = load_policy(EMBEDDED_MODEL)
seeds = candidate_seeds(11, 2, 3, 4)
x = policy.sample(["a handwritten digit five"] * 4, seeds, steps=6, solver="dpm2").x0
save_file({"noise": initial_noise(seeds, policy.latent_shape), "x0": x.contiguous()}, sys.argv[1])
"""


def test_seed_replay_is_bit_identical_across_processes(tmp_path, embedded_policy):
    out = tmp_path / "replay.safetensors"
    subprocess.run([sys.executable, "-c", _REPLAY, str(out)], check=True, timeout=300)
    other = load_file(str(out))
    seeds = candidate_seeds(11, 2, 3, 4)
    torch.set_num_threads(1)  # as the replay; the next test gets its count back (tests/conftest.py)
    here = embedded_policy.sample(["a handwritten digit five"] * 4, seeds, steps=6, solver="dpm2").x0
    assert torch.equal(other["noise"], initial_noise(seeds, embedded_policy.latent_shape))
    assert torch.equal(other["x0"], here)
