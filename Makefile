# Fresh machine: `make run` sets up .venv and opens the chat on the embedded default;
# `make test` sets up .venv and runs every test (CI runs this).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PROMPT  ?= What is the capital of France?

.PHONY: setup run generate test test-fast bench gpu-kit gpu-check clean

$(BIN)/spectui: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU machines: take the CPU build of torch first, or pip pulls a CUDA build of several GB.
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install -q torch==2.13.0; fi
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/spectui

setup: $(BIN)/spectui

run: setup
	$(BIN)/spectui chat

generate: setup
	$(BIN)/spectui generate "$(PROMPT)"

# Two workers (pytest-xdist): the tests outside tests/tui in one, in order; the TUI tests beside them
# (tests/conftest.py says why). OMP_WAIT_POLICY=PASSIVE: an OpenMP thread that waits sleeps rather than
# spins, or a torch product whose other thread the other worker's processes hold up spins for the rest
# of its time slice (a drafting test took 165 s beside the TUI tests against 14 s alone; 21 s passive).
test: setup
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -q -n 2 --dist loadgroup tests

# The quick loop (1:41 on a 2-core Xeon): unit, engine and kernel tests without the embedded model's
# weights, tmux or slow tests (tests/conftest.py, --fast). CI runs `make test`.
test-fast: setup
	$(BIN)/python -m pytest -q --fast tests/unit tests/engine tests/kernels

bench: setup
	$(BIN)/spectui bench --prompts ../shared/data/vicuna_bench_questions.jsonl --json docs/bench.json

# The GPU kit (docs/gpu.md): gpu-kit here fills .whl/ (the wheels a lent GPU machine lacks);
# it pins .venv's versions (make setup first). gpu-check runs there, in a copy of the repo that
# carries .whl: no venv, no network, so no setup.
gpu-kit:
	PY=$(BIN)/python bash scripts/gpu_kit.sh

gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV) *.egg-info
