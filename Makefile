# The two commands of the README. Both set everything up first (idempotent).
PY := .venv/bin/python

.PHONY: setup sweep test
setup:
	@./scripts/setup.sh

# The main job: the quant sweep on the embedded defaults (local Ray, MLflow SQLite mlflow.db).
sweep: setup
	$(PY) -m service.sweep tune_configs/quant.yaml

# The whole test suite, as CI runs it (with a Docker engine: setup starts one if none runs,
# and stops that one, only, afterwards).
test:
	@./scripts/setup.sh --test
	$(PY) -m pytest; rc=$$?; ./scripts/setup.sh --stop-docker; exit $$rc
