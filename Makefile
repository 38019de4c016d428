# proxy-operator developer targets.  `make test` is the test command CI runs.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# pytest-xdist worker processes for test / test-fast (docs/testing.md); TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2

.PHONY: deps demo-deps venv venv-demo test test-fast demo lint bench check-config crds kvm-ssh-secret clean lock

## lock: the image's hashed lock files (requirements.lock from pyproject.toml with the kvm and aws extras,
## requirements-build.lock from requirements-build.in) for Python 3.11 on any platform; needs uv
UV ?= uv
LOCK_FLAGS := --generate-hashes --universal --python-version 3.11
lock:
	$(UV) pip compile pyproject.toml --extra kvm --extra aws $(LOCK_FLAGS) -o requirements.lock
	$(UV) pip compile requirements-build.in $(LOCK_FLAGS) -o requirements-build.lock

## deps: the Debian packages of .ci/apt-packages.txt (installs the missing ones; needs root then)
deps:
	bash .ci/install-deps

## demo-deps: only what `make demo` runs, .ci/apt-packages-demo.txt (redis-server, squid); as a
## user without root it names what is missing and the command to run
demo-deps:
	bash .ci/install-deps demo

## venv: .venv with the project, the test and kvm extras (libvirt-python: compiled) and the client
venv: $(VENV)/.installed-test

$(VENV)/.installed-test: pyproject.toml clients/python/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,kvm]' -e ./clients/python
	touch $@

## venv-demo: .venv with what `make demo` imports only: the project and its demo extra (no
## libvirt-python, no test tools); nothing to do when `make venv` already made it
venv-demo: $(VENV)/.installed-demo

$(VENV)/.installed-demo: pyproject.toml
	@if [ $(VENV)/.installed-test -nt pyproject.toml ]; then \
	  echo "$(VENV) has the test dependencies, which include the demo's"; \
	else \
	  set -e; test -x $(BIN)/python || $(PY) -m venv $(VENV); \
	  echo "$(BIN)/pip install -e '.[demo]'"; \
	  $(BIN)/pip install -q --upgrade pip; $(BIN)/pip install -q -e '.[demo]'; \
	fi
	touch $@

## test: the whole suite in TEST_WORKERS processes (installs missing Debian packages first; starts its own
## Redis, Squid, sshd, libvirtd, fakes per worker; needs root for libvirtd)
## The real-guest VM test (-m guest) runs after the rest, alone: its guest runs under TCG emulation and
## boots several times slower with the other tests beside it (docs/testing.md).
## Both phases always run (a failure in the first never hides the guest's result); the target fails
## when either failed, and names which.
test: deps venv
	@failed=""; \
	echo "$(BIN)/pytest -q -ra -n $(TEST_WORKERS) -m 'not e2e and not kvmhost and not guest'"; \
	$(BIN)/pytest -q -ra -n $(TEST_WORKERS) -m 'not e2e and not kvmhost and not guest' || failed="$$failed suite"; \
	echo "$(BIN)/pytest -q -ra -m guest"; \
	$(BIN)/pytest -q -ra -m guest || failed="$$failed guest"; \
	if [ -n "$$failed" ]; then echo "make test: failed phase(s):$$failed" >&2; exit 1; fi

## test-fast: the suite without the tests marked slow (most still start real processes)
test-fast: venv
	$(BIN)/pytest -q -m 'not slow' -n $(TEST_WORKERS)

## demo: `proxy-operator demo`, the whole operator on loopback without Docker, on a SIMULATED cluster
## (devcluster's API fake + kubelet stand-in running real Squids); prints KUBECONFIG, token and URLs;
## Ctrl-C stops it. DEMO_API_PORT / DEMO_FLOWER_PORT change the ports (8080, 5555). See docs/devcluster.md.
## Installs only what it runs (demo-deps, venv-demo), not the test suite's packages.
demo: demo-deps venv-demo
	$(BIN)/proxy-operator demo

## lint: the gates CI runs before the tests (docs/testing.md, "Gates"), configured in pyproject.toml:
## ruff on the product packages, the tests and the benchmarks (a looser rule set there); mypy on the
## product packages (every function body checked); lint-imports, the layout contracts of
## docs/architecture.md ("Layout rules").  Each runs even when one before it failed; the target
## fails when any did, and names which.
LINT_PACKAGES := app api workers watchers cli
lint: deps venv
	@failed=""; \
	echo "$(BIN)/ruff check $(LINT_PACKAGES) clients devcluster tests bench"; \
	$(BIN)/ruff check $(LINT_PACKAGES) clients devcluster tests bench || failed="$$failed ruff"; \
	echo "$(BIN)/mypy $(LINT_PACKAGES)"; \
	$(BIN)/mypy $(LINT_PACKAGES) || failed="$$failed mypy"; \
	echo "$(BIN)/lint-imports"; \
	$(BIN)/lint-imports --no-cache || failed="$$failed lint-imports"; \
	if [ -n "$$failed" ]; then echo "make lint: failed:$$failed" >&2; exit 1; fi

bench: venv
	$(BIN)/python bench/pipeline.py

check-config: venv
	$(BIN)/proxy-operator check-config $(or $(FILE),deploy/samples/providers.yaml)

crds: venv
	$(BIN)/proxy-operator crds

## kvm-ssh-secret: print the kvm-ssh Secret from KVM_SSH_KEY and KVM_KNOWN_HOSTS (refuses a .pub key)
kvm-ssh-secret: venv
	$(BIN)/proxy-operator kvm-ssh-secret --key $(or $(KVM_SSH_KEY),$(HOME)/.ssh/id_ed25519) \
	  --known-hosts $(or $(KVM_KNOWN_HOSTS),$(HOME)/.ssh/kvm_known_hosts)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
