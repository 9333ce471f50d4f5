# Two commands set everything up: `make run` serves the app, `make test` runs the suite.
PY := .venv/bin/python
export HF_HUB_OFFLINE ?= 1

.PHONY: run test lint bench quality sweep

run:
	scripts/setup.sh
	GRADIO_SERVER_NAME=$${GRADIO_SERVER_NAME:-127.0.0.1} $(PY) app.py

test:  # the model converted and its PCA tiers calibrated once here, so the two workers start on a warm cache
	scripts/setup.sh --dev --convert
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder  # two workers, a file each, longest first (docs/testing.md)

lint:
	scripts/setup.sh --dev
	$(PY) -m ruff check .

bench:
	scripts/setup.sh
	$(PY) -m kernels.bench

quality:
	scripts/setup.sh
	$(PY) -m codeckv quality
