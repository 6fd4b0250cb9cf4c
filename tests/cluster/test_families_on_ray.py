"""The whole job on each model family's tiny real pipeline, in latent space, on a real local Ray.

For SD3.5, FLUX.1 and SANA folders (`diffusion.tiny`), with the JPEG-compressibility reward and a
prompt file: two explorers give bitwise the single-process trainer's weights (so one explorer does too,
as `test_cluster.py` shows on the embedded model), and a checkpointed single-process run resumes
bitwise.
"""

from __future__ import annotations

import pytest
import torch
from jobs import assert_same, run_job, single_process
from tiny import tiny_family_config

from learner.evaluation import evaluated_weights
from learner.trainer import Trainer

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("no_leftover_actors")]

FAMILIES = ["sd3", "flux", "sana"]


@pytest.mark.parametrize("family", FAMILIES)
def test_two_explorers_give_the_single_process_weights(family, tiny_folder, local_ray, tmp_path):
    cfg = tiny_family_config(tiny_folder(family), "cluster.explorers.count=2", ray=True)
    weights, history = run_job(cfg, tmp_path / family)
    assert len(history) == cfg.run.iterations and not any(m.get("skipped") for m in history)
    assert_same(weights, single_process(cfg))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_checkpointed_run_resumes_bitwise(family, tiny_folder, tmp_path):
    cfg = tiny_family_config(tiny_folder(family), "run.iterations=2")
    straight = Trainer(cfg, tmp_path / "a")
    straight.run(log=lambda _: None)
    first = Trainer(cfg, tmp_path / "b")
    first.run(1, log=lambda _: None)
    resumed = Trainer(cfg, tmp_path / "b")
    resumed.resume()
    resumed.run(log=lambda _: None)
    a, b = evaluated_weights(straight.state), evaluated_weights(resumed.state)
    assert_same(a, b)
    assert all(bool(torch.isfinite(v).all()) for v in a.values())
