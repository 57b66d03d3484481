# The two commands a user needs: `make run` and `make test`. Both set up first (idempotent).
# Recipes read the home as the shell variable "$$FLYWHEEL_HOME", always quoted (a home may hold
# spaces); `make lint` runs shellcheck on every recipe (scripts/lint_shell.sh) to keep it so.
# PROFILE unset: the profile this home's flywheel runs with (FLYWHEEL_HOME/flywheel.json), tiny for a new home.
PROFILE ?=
SEED ?=
export FLYWHEEL_HOME ?= $(CURDIR)/.flywheel
VENV := .venv
PY := $(VENV)/bin/python
# The pretrained models the profile names (e.g. `name_or_path: smollm2-135m-instruct`): set-up fetches
# and imports them into the model cache (scripts/fetch_model.py; a no-op once they are there).
PROFILE_MODELS = $(shell python3 scripts/fetch_model.py --named-in configs/$(or $(PROFILE),$(shell python3 scripts/home_profile.py),tiny).yaml)
PROFILE_ARG = $(if $(PROFILE),--profile $(PROFILE),)

.PHONY: setup run resume test lint dagster-ui mlflow-ui audit fuzz judge models promote rollback serve clean
setup:
	@bash scripts/setup.sh $(foreach model,$(PROFILE_MODELS),--model $(model))

run: setup
	$(PY) -m pipelines.run $(PROFILE_ARG) $(if $(SEED),--seed $(SEED),) $(ARGS)

# After a killed or failed `make run`: its failed run again from where it stopped, then the rounds left.
resume: setup
	$(PY) -m pipelines.run --resume

# --model: the real model behind the `smollm2_folder` fixture (tests marked realmodel).
# Two pytest-xdist workers (one core each; tests/conftest.py shares the threads), groups kept on one
# worker (--dist loadgroup); then the `serial` tests alone. Any non-zero exit fails, 5 (nothing ran) too.
test: setup
	@bash scripts/setup.sh --browser --tools --model smollm2-135m-instruct
	$(PY) -m pytest tests -n 2 --dist loadgroup -m "not serial" $(PYTEST_ARGS)
	$(PY) -m pytest tests -m serial $(PYTEST_ARGS)

# Format, lint (with isort rules) and the layer contracts; CI runs it before the tests.
lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/lint_shell.sh

# The UIs listen on this machine only: they have no login, and the Dagster UI can launch runs.
# UI_HOST=0.0.0.0 exposes them to the network (put an authenticating proxy in front first).
UI_HOST ?= 127.0.0.1

# The Dagster UI and daemon, as `dagster dev` runs them, answering only requests addressed to this
# machine (a host and origin check against DNS rebinding: pipelines/ui.py). Behind a proxy, name
# the host it uses: make dagster-ui UI_ALLOWED_HOSTS=dagster.example.internal
dagster-ui: setup
	mkdir -p "$$FLYWHEEL_HOME/dagster"
	DAGSTER_HOME="$$FLYWHEEL_HOME/dagster" UI_ALLOWED_HOSTS="$(UI_ALLOWED_HOSTS)" $(PY) -m pipelines.ui --host $(UI_HOST)

# Re-score a stored round with a stricter verifier (docs/verifiers.md): make audit ROUND=2 [CONFIG='{"ops": ...}']
ROUND ?= 1
audit: setup
	$(PY) -m pipelines.audit $(PROFILE_ARG) --round $(ROUND) $(if $(CONFIG),--config-json '$(CONFIG)',)

# Wrong answers through the training reward (docs/reward-fuzz.md): make fuzz [ARGS='--attempts 100000 --families code']
fuzz: setup
	$(PY) benchmarks/reward_fuzz.py $(ARGS)

# A judge of our own for the judge tier (docs/verifiers.md#the-judge-tier), fine-tuned from SmolLM2 on
# rule-labelled verdicts: make judge [ARGS='--steps 150'], then --set reward.judge.model=<home>/judge
judge: setup
	@bash scripts/setup.sh --model smollm2-135m-instruct
	$(PY) -m training.judge_sft $(PROFILE_ARG) --out "$$FLYWHEEL_HOME/judge" $(ARGS)

# Model registry (README "Model registry"): make models | make promote VERSION=3 [FORCE=1] | make rollback
models: setup
	$(PY) -m pipelines.registry $(PROFILE_ARG) list

promote: setup
	@test -n "$(VERSION)" || { echo "usage: make promote VERSION=<n> [FORCE=1]"; exit 2; }
	$(PY) -m pipelines.registry $(PROFILE_ARG) promote $(VERSION) $(if $(FORCE),--force,)

rollback: setup
	$(PY) -m pipelines.registry $(PROFILE_ARG) rollback

# The champion agent over HTTP (README "Serving"), on this machine only unless SERVE_HOST says otherwise:
# make serve [PORT=8080] [VERSION=<n> | ALIAS=challenger] [ENGINE=hf|vllm]. The version is resolved once, at start.
PORT ?= 8080
SERVE_HOST ?= 127.0.0.1
serve: setup
	$(PY) -m pipelines.serve $(PROFILE_ARG) --host $(SERVE_HOST) --port $(PORT) \
		$(if $(VERSION),--version $(VERSION),) $(if $(ALIAS),--alias $(ALIAS),) $(if $(ENGINE),--engine $(ENGINE),)

mlflow-ui: setup
	$(VENV)/bin/mlflow ui --backend-store-uri "sqlite:///$$FLYWHEEL_HOME/mlflow.db" --host $(UI_HOST) --port 5000

# Deletes the home, only a flywheel home (its flywheel.json) that no run holds: never an empty
# FLYWHEEL_HOME (the current directory), never another folder (scripts/clean_home.py).
clean:
	@python3 scripts/clean_home.py
