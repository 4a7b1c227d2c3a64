# labelrm task runner (GNU make). `make` or `make help` lists the targets.
#
# Every target that needs Python depends on the virtualenv, so `make run` and
# `make test` work from a fresh clone: the first call creates .venv and installs
# the project with its dev extras; later calls reinstall only when
# pyproject.toml changed (stamp file .venv/.installed).

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

PYTHON   ?= python3
VENV     ?= .venv
BIN      := $(VENV)/bin
PY       := $(BIN)/python
STAMP    := $(VENV)/.installed

# `make run`
LISTEN   ?= 127.0.0.1:7100
CONSOLE  ?= 127.0.0.1:7180
METRICS  ?= 127.0.0.1:7190
DATA_DIR ?= ./labelrm-data

# `make test`: extra pytest arguments, e.g. make test PYTEST_ARGS='-k apply -x'
PYTEST_ARGS ?=
# `make test`: parallel pytest workers (pytest-xdist); 0 runs the tests in one process. The
# tests mostly wait on processes and sockets, so twice the cores keeps a machine busy.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) * 2 )))
# `make bench`: e.g. make bench BENCH_ARGS='--only apply_cycle --database-url postgresql://...'
BENCH_ARGS ?=
# The system PostgreSQL used by `make test-all-dbs` (second run; PYTEST_ARGS passes through).
TEST_PG_URL ?= postgresql://postgres@127.0.0.1:5432/test
# Set LABELRM_TEST_DATABASE_URL (environment or make variable) to run the suite
# against an external PostgreSQL instead of the embedded one; empty = embedded.
LABELRM_TEST_DATABASE_URL ?=
unexport LABELRM_TEST_DATABASE_URL
TEST_ENV := $(if $(LABELRM_TEST_DATABASE_URL),env LABELRM_TEST_DATABASE_URL='$(LABELRM_TEST_DATABASE_URL)',env -u LABELRM_TEST_DATABASE_URL)

TYPED := labelrm_common rm_server labelrm_client clients rmctl ecm_agent engineconn bench tests

.PHONY: ha-up ha-down ha-status help venv run docs test test-system test-all _pytest test-setup test-all-dbs format lint typecheck protos protos-check sync-client bench bench-compare bench-native bench-peers clean distclean

help: ## list the targets
	@echo "labelrm make targets:"
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) \
	  | awk 'BEGIN {FS = ":.*## "}; {printf "  %-14s %s\n", $$1, $$2}'
	@echo
	@echo "variables: PYTEST_ARGS='...'  TEST_WORKERS=$(TEST_WORKERS)  LABELRM_TEST_DATABASE_URL=postgresql://...  LISTEN=$(LISTEN)  CONSOLE=$(CONSOLE)  METRICS=$(METRICS)  DATA_DIR=$(DATA_DIR)  PYTHON=$(PYTHON)"

venv: $(STAMP) ## create .venv (if missing) and pip install -e '.[dev]' (re-runs when pyproject.toml changes)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "labelrm needs Python >= 3.11, $(PYTHON) is " + sys.version.split()[0])'
	@test -x $(PY) || { echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

run: $(STAMP) ## run labelrm: rm-server --dev (embedded database in ./labelrm-data + one local agent), 127.0.0.1:7100, web console on 127.0.0.1:7180, metrics on 127.0.0.1:7190, foreground
	exec $(BIN)/rm-server --dev --data-dir '$(DATA_DIR)' --listen '$(LISTEN)' --console-listen '$(CONSOLE)' --metrics-listen '$(METRICS)'

test: $(STAMP) ## run the test suite on TEST_WORKERS parallel workers, without the slow system tests (PYTEST_ARGS=..., honours LABELRM_TEST_DATABASE_URL); skipped groups listed with their reason
	@$(MAKE) _pytest MARKS='not system'

test-system: $(STAMP) ## run only the slow system tests: a Patroni cluster, a browser, a fresh clone's install
	@$(MAKE) _pytest MARKS='system'

test-all: $(STAMP) ## the whole suite, system tests included (what CI runs on the embedded PostgreSQL)
	@$(MAKE) _pytest MARKS=''

_pytest:
	@echo "test database: $(or $(LABELRM_TEST_DATABASE_URL),embedded PostgreSQL); $(TEST_WORKERS) workers; tests: $(or $(MARKS),all)"
	@rc=0; log=$$(mktemp); $(TEST_ENV) $(BIN)/pytest -rs -n $(TEST_WORKERS) $(if $(MARKS),-m '$(MARKS)') $(PYTEST_ARGS) | tee "$$log" || rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: counted as a failure" >&2; fi; \
	  if grep -q '^SKIPPED' "$$log"; then \
	    echo "some tests were skipped (reasons above); to run everything: sudo make test-setup, then make test (as root)"; \
	  fi; rm -f "$$log"; exit $$rc

test-setup: ## as root, on Debian: install what the skipped tests need (only what is missing: Debian packages, test users, EngineConn runtime, Patroni, Chromium); CI runs the same script
	bash scripts/install_test_deps.sh

test-all-dbs: $(STAMP) ## the whole suite twice: embedded PostgreSQL, then the system PostgreSQL (TEST_PG_URL) without the system tests
	$(MAKE) test-all LABELRM_TEST_DATABASE_URL=
	$(MAKE) test LABELRM_TEST_DATABASE_URL='$(TEST_PG_URL)'

format: $(STAMP) ## ruff format + ruff check --fix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

lint: $(STAMP) ## ruff check + ruff format --check + import layering (lint-imports) + buf lint (protos) + generated sync client and settings tables up to date
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(PY) scripts/gen_sync_client.py --check
	$(PY) scripts/gen_settings_doc.py --check
	$(BIN)/lint-imports --no-cache
	$(BIN)/buf lint protos

typecheck: $(STAMP) ## mypy (strict) on labelrm_common, rm_server, labelrm_client (and its old name clients), ecm_agent, engineconn and bench; tests (untyped defs allowed)
	$(BIN)/mypy $(TYPED)

docs: $(STAMP) ## regenerate the settings tables of docs/configuration.md from the settings declarations (rm-server, ecm-agent, EngineConn runtime)
	$(PY) scripts/gen_settings_doc.py --write

protos: $(STAMP) ## regenerate protos/labelrm/v1/*_pb2*.py(i) from the .proto files, then buf lint
	$(PY) scripts/gen_protos.py
	$(BIN)/buf lint protos

sync-client: $(STAMP) ## regenerate the SDK's blocking client (labelrm_client/_sync_*.py) from the async one (labelrm_client/_aio_*.py)
	$(PY) scripts/gen_sync_client.py

protos-check: $(STAMP) ## regenerate into the tree; fail (and show the diff) if protos/ differs from git HEAD
	bash scripts/ci_check_drift.sh

bench: bench-native ## run every benchmark and print the targets (python -m bench $(BENCH_ARGS); docs/benchmarks.md)
	$(PY) -m bench $(BENCH_ARGS)

bench-compare: bench-native ## what a change costs: the benchmarks of REV and of this tree, interleaved (make bench-compare REV=<commit>)
	$(PY) -m bench.compare --rev '$(REV)' $(BENCH_ARGS)

bench-peers: $(STAMP) ## measure Ray on this machine (pinned, in its own build/peers-venv): placement groups and actors, sequential and 16 in flight; writes build/bench-peers.json (python -m bench.peers $(BENCH_ARGS))
	$(PY) -m bench.peers $(BENCH_ARGS)

bench-native: $(STAMP) ## build the benchmarks' C++ load generator (needs g++ pkg-config libgrpc++-dev protobuf-compiler-grpc)
	@$(PY) -c 'from bench.native import loadgen_binary; print(loadgen_binary())'

clean: ## remove caches and build output (keeps .venv and ./labelrm-data)
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean ## clean, and remove .venv too (./labelrm-data is never removed)
	rm -rf $(VENV)

ha-up: ## start a local HA PostgreSQL (etcd + 3 Patroni members, synchronous replication; deploy/ha/ha.sh)
	bash deploy/ha/ha.sh up

ha-down: ## stop the local HA PostgreSQL and delete its state
	bash deploy/ha/ha.sh down

ha-status: ## patronictl list of the local HA PostgreSQL
	bash deploy/ha/ha.sh status
