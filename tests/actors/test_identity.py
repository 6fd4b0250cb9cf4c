"""The names a user finds a run's job and actors by (docs/monitoring.md's table)."""

import pytest

from actors.identity import actor_name, job_name, job_namespace, run_label


def test_actor_names_and_an_unknown_role():
    assert [actor_name("learner", 0), actor_name("explorer", 3), actor_name("scorer", 1)] == [
        "solrl-learner-0", "solrl-explorer-3", "solrl-scorer-1"]
    with pytest.raises(ValueError, match="unknown actor role 'explorers'"):
        actor_name("explorers", 0)


def test_the_run_label_is_the_run_directorys_name_else_the_configs():
    assert run_label("/shared/runs/exp1", "embedded") == "exp1"
    assert run_label(None, "embedded") == "embedded"


def test_a_namespace_keeps_only_characters_ray_accepts_and_starts_with_the_job_name():
    assert job_name("exp1") == "solrl-exp1"
    assert job_namespace("my run/2", "3fa2b1c4") == "solrl-my_run_2-3fa2b1c4"
