"""The project's virtualenv runs the ecosystem on its own: torch, torchvision (its compiled operators too),
transformers and diffusers import and work in a fresh process that never imports this project — as a
user's script or notebook in `.venv` would, and as the README's "load the result in diffusers" does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROJECT_PACKAGES = ("actors", "bench", "cluster", "diffusion", "learner", "rewards", "weight_sync")

SCRIPT = """
import json, sys
import torch, torchvision
from torchvision.ops import nms
from transformers import CLIPImageProcessor, CLIPTextModelWithProjection
from diffusers import StableDiffusion3Pipeline

boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0], [20.0, 20.0, 30.0, 30.0]])
kept = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist()   # the compiled kernel, on the CPU
pipe = StableDiffusion3Pipeline.from_pretrained(sys.argv[1])
image = pipe("a red square", num_inference_steps=2, height=32, width=32, output_type="pt",
             generator=torch.Generator().manual_seed(0)).images
processor = CLIPImageProcessor()
project = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
print(json.dumps({"nms": kept, "shape": list(image.shape), "finite": bool(torch.isfinite(image).all()),
                  "versions": [torch.__version__, torchvision.__version__], "project": project}))
"""


def test_a_fresh_venv_process_imports_and_runs_torchvision_transformers_and_diffusers_without_the_project(
        tiny_folder, tmp_path):
    folder = tiny_folder("sd3")  # saved by this process; read by one that has never seen the project
    # -I: no PYTHONPATH, no current directory on sys.path; run from an empty folder all the same
    run = subprocess.run([sys.executable, "-I", "-c", SCRIPT, str(folder), json.dumps(PROJECT_PACKAGES)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["nms"] == [0, 2]  # box 1 overlaps box 0 (IoU 0.68) and goes; box 2 stays
    assert result["shape"] == [1, 3, 32, 32] and result["finite"]
    assert result["project"] == []
    torch_version, vision_version = (v.split("+")[0] for v in result["versions"])
    assert (torch_version, vision_version) == ("2.14.1", "0.29.1")  # the matched pair the Makefile installs


GROUPED = """
import os, pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(3))
def test_grouped(i, request):
    out = os.path.join(os.environ["GROUPED_OUT"], f"{request.node.path.stem}-{i}")
    with open(out, "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_pytest_xdist_keeps_a_group_on_one_worker(tmp_path):
    """`make test` relies on `--dist loadgroup`: tests sharing an expensive fixture across files (the three hosts
    and the learner group's run, tests/cluster/conftest.py) must run in one worker. With pytest 9.2.0 xdist 3.8
    silently stops grouping (pytest-dev/pytest-xdist#1386), hence the pinned pytest 9.1.1."""
    tests, out = tmp_path / "tests", tmp_path / "out"
    tests.mkdir()
    out.mkdir()
    for name in ("test_a.py", "test_b.py"):
        (tests / name).write_text(GROUPED)
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q",
                          "-p", "no:cacheprovider", str(tests)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env={**os.environ, "GROUPED_OUT": str(out)})
    assert run.returncode == 0, run.stdout[-3000:]
    workers = {path.name: path.read_text() for path in out.iterdir()}
    assert len(workers) == 6 and len(set(workers.values())) == 1, workers
