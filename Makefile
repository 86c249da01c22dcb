# SERA workbook. `make help` lists the targets.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := notebooks,dev

.DEFAULT_GOAL := help
.PHONY: help setup demo test bench tiny clean

help:  ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

setup: $(STAMP)  ## Create .venv with the package (editable) and its extras; quick when nothing changed

demo: setup  ## Main job on the embedded default: write both benchmarks' evaluation tasks, solve them with the expert
	$(BIN)/sera tasks --env textcraft --split val --out runs/demo/textcraft_val.jsonl
	$(BIN)/sera solve --env textcraft --tasks runs/demo/textcraft_val.jsonl --mode delegate
	$(BIN)/sera tasks --env textworld --split test --out runs/demo/textworld_test.jsonl
	$(BIN)/sera solve --env textworld --tasks runs/demo/textworld_test.jsonl --mode delegate

test: setup  ## Run the tests: pytest, then every notebook with nbval
	$(BIN)/python -m pytest tests
	SERA_SMOKE=1 $(BIN)/python -m pytest --nbval-lax notebooks

bench: setup  ## Benchmarks (numbers go to docs/benchmarks.md)
	$(BIN)/python scripts/bench_textcraft.py
	$(BIN)/python scripts/bench_textworld.py
	$(BIN)/python scripts/bench_runtime.py

tiny: setup  ## Rebuild the shipped tiny model from its recipe (about 40 min on 2 cores) and measure it
	$(BIN)/sera tiny build --out sera_core/assets/tiny
	$(BIN)/sera tiny measure --out sera_core/assets/tiny --record

clean:  ## Remove run outputs (keeps .venv)
	rm -rf runs .pytest_cache
