"""`make dashboard-check`'s own rules that need neither Prometheus nor a browser (the check itself runs them)."""

import pytest

from cluster.config.loading import load_config
from cluster.monitoring import dashboard_check


def test_without_its_tools_it_names_the_packages_and_starts_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither prometheus nor chromium on it
    out = tmp_path / "out"
    assert dashboard_check.main(["--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == ("error: prometheus, chromium not found; install Debian's packages: "
                                               "apt-get install -y prometheus chromium")
    assert not out.exists()


def test_the_short_job_is_a_valid_config_with_every_kind_of_actor():
    config = load_config(dashboard_check.CONFIG, dashboard_check.check_sets(24))
    assert config.run.iterations == 24
    assert (config.cluster.explorers.count, config.cluster.learner.count, config.cluster.scorers.count) == (2, 1, 1)
    assert config.eval.every == 2  # held-out series exist by the third iteration, when the queries run


@pytest.mark.parametrize(("env", "file", "expected"), [
    ({"RAY_AUTH_MODE": "disabled"}, "from-file", None),
    ({"RAY_AUTH_TOKEN": " from-env \n"}, "from-file", "from-env"),
    ({}, "from-file", "from-file"),
    ({}, None, None),
])
def test_the_token_is_found_where_ray_looks_for_it(tmp_path, monkeypatch, env, file, expected):
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    path = tmp_path / "auth_token"
    if file is not None:
        path.write_text(file + "\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path))
    assert dashboard_check.auth_token() == expected
