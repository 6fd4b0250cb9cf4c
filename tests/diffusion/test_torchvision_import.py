"""torchvision beside the CPU torch: importable through the project, its missing operators declared only."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import torch
import diffusion                                   # prepares torchvision (first, as every project process)
from diffusion.torchvision_import import prepare_torchvision, _extension_path
import torchvision, open_clip, timm                # the libraries the reward models need
from transformers import CLIPImageProcessor        # transformers 5 imports torchvision for it
ops = prepare_torchvision()
print("extension", _extension_path() is not None, "ops", ops, "has_ops", torchvision.extension._has_ops())
if not ops:                                        # declared without kernels: calling it must fail loudly
    try:
        torch.ops.torchvision.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
        print("nms ran")
    except (RuntimeError, NotImplementedError):
        print("nms refused")
"""


def test_torchvision_and_its_users_import_after_the_project_and_missing_ops_stay_missing():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout.split()
    extension, ops, has_ops = out[1] == "True", out[3] == "True", out[5] == "True"
    assert extension  # torchvision is a dependency of the project
    assert ops == has_ops  # what prepare_torchvision reports is what torchvision itself finds
    if not ops:
        assert run.stdout.strip().endswith("nms refused")
