# Two commands matter: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH := torch==2.14.1 torchvision==0.29.1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PYTHONUNBUFFERED := 1

.PHONY: demo demo-local test lint bench bench-alignment world clean-venv dashboard-check gpu-check

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch and torchvision first, together: a matched pair of builds (CUDA builds, which also run on a CPU),
	# so torchvision's compiled operators load beside torch in every process; nothing after may replace them.
	$(PY) -m pip install -q --no-compile $(TORCH)
	$(PY) -m pip install -q --no-compile -c constraints.txt -e '.[dev]'
	# ImageReward's BLIP definition only: its metadata pins timm 0.6 and pulls datasets and a CLIP
	# from git, none of which the project uses (rewards/image_reward.py loads just the BLIP files).
	$(PY) -m pip install -q --no-compile --no-deps image-reward==1.5
	# Byte-compiled once, on every core (pip compiles file by file: half the install's time on two cores).
	# The one file left out is torch's own Python 3.12 test fixture, which no Python 3.11 can compile.
	$(PY) -m compileall -q -j 0 -x 'torch/testing/_internal/py312_intrinsics\.py' $(VENV)/lib
	$(PY) -c "import torch, torchvision; assert (torch.__version__.split('+')[0], torchvision.__version__.split('+')[0]) == ('2.14.1', '0.29.1'), (torch.__version__, torchvision.__version__)"
	touch $(STAMP)

# The embedded Sol-RL job on a local Ray: explorer + learner actors, weight sync, dashboard metrics.
demo: $(STAMP)
	rm -rf runs/demo
	$(PY) -m cluster.launch --config configs/embedded.yaml --set run.iterations=10 --run-dir runs/demo

# The same loop in one process, with a rank-fidelity table first.
demo-local: $(STAMP)
	$(PY) -m bench.demo --config configs/embedded.yaml

# Parallel test workers (pytest-xdist): most of a Ray test's time is processes starting and waiting on each
# other, which a second worker fills. TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	# pytest exits 5 when it collects no tests: that is a failure here too. The slowest tests are listed
	# last, so a CI log shows where the suite's time goes.
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15 tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 1; fi; exit $$rc

# The job as its users watch it: a short job submitted to a local Ray, every Grafana query evaluated by a
# real Prometheus, the dashboard's Jobs and Actors pages captured in headless Chromium (docs/monitoring.md).
DASHBOARD_TOOLS := prometheus chromium
dashboard-check: $(STAMP)
	@missing=""; for t in $(DASHBOARD_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get install -y -q $$missing || { apt-get update -q && apt-get install -y -q $$missing; }; \
		else echo "dashboard-check needs Debian's$$missing: sudo apt-get install -y$$missing"; exit 2; fi; \
	fi
	$(PY) -m cluster.dashboard_check --out runs/dashboard-check

# The prepared GPU check (docs/gpu.md): one GPU, at most 8 minutes, no Ray, TE or network. On a CPU:
# make gpu-check GPU_CHECK_ARGS="--device cpu --tiny".
GPU_CHECK_ARGS ?=
gpu-check: $(STAMP)
	$(PY) -m bench.gpu_check --out bench/results/gpu_check $(GPU_CHECK_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Benchmarks (not tests): each prints a table and writes JSON under bench/results/. The evidence suite
# (hours on two cores) is one process per training run and resumes where it stopped: a run whose
# bench/results/runs/ file exists is not run again; it ends by writing docs/evidence.md and the figures.
bench: $(STAMP)
	$(PY) -m bench.rank_fidelity --prompts 30 --json bench/results/rank_fidelity.json
	$(PY) -m bench.rank_fidelity --prompts 30 --set "reward.weights={digit_margin: 1.0}" \
		--json bench/results/rank_fidelity_margin.json
	$(PY) -m bench.adaptive_explore --prompts 24 --set "reward.weights={digit_margin: 1.0}" \
		--json bench/results/adaptive_explore.json
	$(PY) -m bench.selection_stats --prompts 24 --set "reward.weights={digit_margin: 1.0}" \
		--json bench/results/selection_stats.json
	$(PY) -m bench.weight_sync --json bench/results/weight_sync.json
	$(PY) -m bench.cluster_throughput --json bench/results/cluster_throughput.json
	$(PY) -m bench.evidence

# The first convergence study, on digit_alignment (log p, which saturates): kept as the record of why the
# evidence suite trains on digit_margin.
bench-alignment: $(STAMP)
	for s in 0 1 2; do $(PY) -m bench.convergence --iterations 60 --seeds $$s --eval-every 4 \
		--set eval.seeds_per_prompt=48 --json bench/results/convergence_seed$$s.json || exit 1; done
	$(PY) -m bench.convergence --merge bench/results/convergence_seed0.json bench/results/convergence_seed1.json \
		bench/results/convergence_seed2.json --json bench/results/convergence.json --png bench/results/convergence.png
	$(PY) -m bench.convergence --iterations 20 --seeds 0,1 --control --art \
		--json bench/results/convergence_20it.json --png bench/results/convergence_20it.png

# Rebuild the embedded world from scratch (data shipped in scikit-learn): classifier, then base model.
world: $(STAMP)
	$(PY) -m rewards.train_digit_classifier
	$(PY) -m diffusion.embedded.train
	$(PY) -m bench.base_model

clean-venv:
	rm -rf $(VENV)
