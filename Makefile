# The two commands of the README. Both create .venv on first use (scripts/setup_venv.sh).
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo test test-unit bench-scheduler

setup:
	@scripts/setup_venv.sh

demo: setup
	$(PY) -m launcher examples/demo.toml --demo

test: setup
	$(PY) -m pytest tests -q

test-unit: setup
	$(PY) -m pytest tests/unit -q

bench-scheduler: setup
	$(PY) -m kernels_bench scheduler
