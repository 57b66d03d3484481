# The two commands a user needs: `make run` and `make test`. Both set up first (idempotent).
PROFILE ?= tiny
SEED ?=
export FLYWHEEL_HOME ?= $(CURDIR)/.flywheel
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup run resume test lint dagster-ui mlflow-ui audit fuzz models promote rollback clean
setup:
	@bash scripts/setup.sh

run: setup
	$(PY) -m pipelines.run --profile $(PROFILE) $(if $(SEED),--seed $(SEED),) $(ARGS)

# After a killed or failed `make run`: its failed run again from where it stopped, then the rounds left.
resume: setup
	$(PY) -m pipelines.run --resume

test: setup
	@bash scripts/setup.sh --browser --tools
	$(VENV)/bin/lint-imports
	$(PY) -m pytest tests $(PYTEST_ARGS)

# The UIs listen on this machine only: they have no login, and the Dagster UI can launch runs.
# UI_HOST=0.0.0.0 exposes them to the network (put an authenticating proxy in front first).
UI_HOST ?= 127.0.0.1

dagster-ui: setup
	DAGSTER_HOME=$(FLYWHEEL_HOME)/dagster $(VENV)/bin/dagster dev --host $(UI_HOST)

# Re-score a stored round with a stricter verifier (docs/verifiers.md): make audit ROUND=2 [CONFIG='{"ops": ...}']
ROUND ?= 1
audit: setup
	FLYWHEEL_PROFILE=$(PROFILE) DAGSTER_HOME=$(FLYWHEEL_HOME)/dagster $(VENV)/bin/dagster asset materialize -m pipelines.definitions \
		--select reward_audit --partition $(ROUND) $(if $(CONFIG),--config-json '$(CONFIG)',)

# Wrong answers through the training reward (docs/reward-fuzz.md): make fuzz [ARGS='--attempts 100000 --families code']
fuzz: setup
	$(PY) benchmarks/reward_fuzz.py $(ARGS)

# Model registry (README "Model registry"): make models | make promote VERSION=3 [FORCE=1] | make rollback
models: setup
	$(PY) -m pipelines.registry --profile $(PROFILE) list

promote: setup
	@test -n "$(VERSION)" || { echo "usage: make promote VERSION=<n> [FORCE=1]"; exit 2; }
	$(PY) -m pipelines.registry --profile $(PROFILE) promote $(VERSION) $(if $(FORCE),--force,)

rollback: setup
	$(PY) -m pipelines.registry --profile $(PROFILE) rollback

mlflow-ui: setup
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(FLYWHEEL_HOME)/mlflow.db --host $(UI_HOST) --port 5000

clean:
	rm -rf $(FLYWHEEL_HOME)
