# hadar-slurm: `make demo` runs the simulator demo, `make test` runs lint, types and tests.
# Every target works on a fresh clone and is idempotent.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_POLICIES ?= hadar,hadare,gavel-las,gavel-makespan,fifo
DEMO_TRACE ?= static_32_seed0
DEMO_CLUSTER ?= 4:4:4
LINT_PATHS := hadar_slurm tests slurm_conf $(wildcard bench)
# slurm_conf/render.py is a standalone script (no hadar_slurm imports): type-checked beside it,
# as are the benchmarks and the tests
TYPECHECK_PATHS := hadar_slurm slurm_conf/render.py bench tests
# Debian packages for the Slurm integration tests and the docker-compose check, each with what
# shows it is installed (a command, or a file): package:probe
DEB_DEPS := munge:munged slurmctld:slurmctld slurmd:slurmd slurm-client:sinfo \
	slurmrestd:slurmrestd libslurm-dev:/usr/include/slurm/slurm.h docker-compose:docker-compose

.PHONY: venv deps demo test lint typecheck pytest clean distclean cluster-up cluster-down \
	cluster-status cluster-demo dist compose-file test-slurm slurm-envs

venv: $(STAMP)

# Re-installs when the packaging or the Cython sources change (rebuilds the extension).
$(STAMP): setup.py pyproject.toml $(wildcard cython_core/*.pyx cython_core/*.pxd cython_core/*.h)
	@if [ ! -x $(BIN)/python ]; then \
		rm -rf $(VENV); \
		if ! $(PYTHON) -m venv $(VENV); then \
			echo "python3 -m venv failed (no ensurepip?): installing python3-venv"; \
			rm -rf $(VENV); \
			if [ "$$(id -u)" != 0 ]; then echo "run as root or install python3-venv" >&2; exit 1; fi; \
			DEBIAN_FRONTEND=noninteractive apt-get update -q && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv && \
			$(PYTHON) -m venv $(VENV); \
		fi; \
	fi
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# Slurm, munge and docker-compose from Debian, for the Slurm integration tests and the check of
# docker-compose.yml; only the missing ones are installed, nothing when all are there.
deps:
	@missing=""; \
	for dep in $(DEB_DEPS); do \
		pkg=$${dep%%:*}; probe=$${dep#*:}; \
		case $$probe in \
			/*) [ -e "$$probe" ] || missing="$$missing $$pkg" ;; \
			*) command -v "$$probe" >/dev/null 2>&1 || missing="$$missing $$pkg" ;; \
		esac; \
	done; \
	if [ -z "$$missing" ]; then \
		echo "deps: all found, nothing to install"; \
	elif [ "$$(id -u)" != 0 ]; then \
		echo "deps: not root, skipping install of$$missing"; \
	else \
		echo "deps: installing$$missing"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

demo: venv
	$(BIN)/hadar-slurm simulate --trace $(DEMO_TRACE) --cluster $(DEMO_CLUSTER) \
		--policy $(DEMO_POLICIES) --plots out/demo-plots --json out/demo.json

lint: venv
	$(BIN)/ruff check $(LINT_PATHS)

typecheck: venv
	$(BIN)/mypy $(TYPECHECK_PATHS)

pytest: venv
	$(BIN)/pytest -q tests

# The Slurm integration tests (every test that uses the dev_cluster fixture, marked `slurm`)
# start their own private dev cluster (slurm_conf/dev-cluster.sh, own state dir and ports) in a
# session fixture and always stop it, also when a test fails; they are skipped without root or
# Slurm, except on CI.  `make test` runs every test on the host's Slurm (Debian bookworm's
# 22.05), then the real-cluster tests again on each newer release in SLURM_SUITES, each in a
# Debian chroot that slurm_conf/slurm-env.sh builds once and caches (trixie: 24.11, sid: 26.05),
# and prints one table of the results per release (out/slurm-tests/summary.txt).
SLURM_SUITES ?= trixie sid
test: venv deps
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy $(TYPECHECK_PATHS)
	rm -rf out/slurm-tests
	HADAR_SLURM_SUMMARY=out/slurm-tests/host.json $(BIN)/pytest -q tests
	bash slurm_conf/test-versions.sh $(SLURM_SUITES)

# The real-cluster tests on one newer Slurm only (a quicker loop): make test-slurm SUITE=sid
SUITE ?= trixie
test-slurm:
	rm -f out/slurm-tests/host.json
	bash slurm_conf/test-versions.sh $(SUITE)

# Build (or check) the chroots of the newer Slurm releases without testing.
slurm-envs:
	for s in $(SLURM_SUITES); do bash slurm_conf/slurm-env.sh build $$s || exit 1; done

# A dev cluster to work with by hand (default state dir /tmp/hadar-devcluster):
#   make cluster-up; eval "$$(slurm_conf/dev-cluster.sh env)"; sinfo; ...; make cluster-down
cluster-up:
	bash slurm_conf/dev-cluster.sh up

cluster-down:
	bash slurm_conf/dev-cluster.sh down

cluster-status:
	bash slurm_conf/dev-cluster.sh status

# Local cluster + a small hinted workload + the sidecar over it; prints its decisions; stops.
cluster-demo: venv
	bash slurm_conf/cluster-demo.sh

# The sdist and the wheel (with the compiled core) in dist/, built in an isolated environment
# with pyproject.toml's build requirements from PyPI (the wheel is built from the sdist).
dist: venv
	rm -rf dist
	$(BIN)/python -m build --outdir dist .

# docker-compose.yml is generated from slurm_conf/nodes.conf (tests/test_compose.py checks it).
compose-file:
	python3 slurm_conf/render.py compose-file

clean:
	rm -rf build dist *.egg-info out .mypy_cache .ruff_cache .pytest_cache
	rm -f hadar_slurm/*.so cython_core/*.c cython_core/*.cpp cython_core/*.html
	find hadar_slurm tests -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
