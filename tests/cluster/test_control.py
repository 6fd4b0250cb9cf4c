"""The control file that steers a running job (its Ray side: tests/cluster/test_cluster.py, elastic explorers)."""

from __future__ import annotations

import pytest

from cluster import control


def test_a_bad_control_file_is_named_and_a_bad_count_refused(tmp_path, capsys):
    (tmp_path / control.CONTROL_FILE).write_text('{"explorers": 0}')
    with pytest.raises(ValueError, match=r"control\.json: explorers: Input should be greater than or equal to 1"):
        control.read_control(tmp_path)
    assert control.main([str(tmp_path), "--explorers", "0"]) == 2
    assert "--explorers must be >= 1" in capsys.readouterr().err
    assert control.main([str(tmp_path / "missing"), "--explorers", "2"]) == 2
    assert control.main([str(tmp_path), "--explorers", "3"]) == 0  # a broken file is replaced
    assert control.read_control(tmp_path).explorers == 3
