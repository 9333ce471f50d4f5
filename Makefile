# Two commands set everything up: `make run` serves the app, `make test` runs the suite.
PY := .venv/bin/python
export HF_HUB_OFFLINE ?= 1

.PHONY: run test lint bench quality sweep

run:
	scripts/setup.sh
	GRADIO_SERVER_NAME=$${GRADIO_SERVER_NAME:-127.0.0.1} $(PY) app.py

test:  # the model converted and its PCA tiers calibrated once here, so the two workers start on a warm cache
	scripts/setup.sh --dev --convert
	# two workers, a file each, longest first; a worker that crashes fails the run, naming its test, instead of
	# being replaced (xdist then deadlocks under loadfile: pytest-dev/pytest-xdist#1378). docs/testing.md
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart=0

lint:
	scripts/setup.sh --dev
	$(PY) -m ruff check .

bench:
	scripts/setup.sh
	$(PY) -m kernels.bench

quality:
	scripts/setup.sh
	$(PY) -m codeckv quality
