"""The whole job on each model family's tiny real pipeline, in latent space, on a real local Ray.

For SD3.5, FLUX.1 and SANA folders (`diffusion.tiny`), with the JPEG-compressibility reward and a
prompt file: two explorers give bitwise the single-process trainer's weights (one explorer does too on the
embedded model, `test_cluster.py`; the explorer count changes only which actor ranks a slot, not what a
family computes). Resumes per family: tests/learner/test_export.py.
"""

from __future__ import annotations

import pytest
from jobs import assert_same, run_job, single_process
from tiny import tiny_family_config

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("no_leftover_actors")]

FAMILIES = ["sd3", "flux", "sana"]


@pytest.mark.parametrize("family", FAMILIES)
def test_two_explorers_give_the_single_process_weights(family, tiny_folder, local_ray, tmp_path):
    cfg = tiny_family_config(tiny_folder(family), "cluster.explorers.count=2", ray=True)
    weights, history = run_job(cfg, tmp_path / family)
    assert len(history) == cfg.run.iterations and not any(m.get("skipped") for m in history)
    assert_same(weights, single_process(cfg))
