# gpuforge — thin entry points; the logic lives in src/gpuforge and roles/.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV   := .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SPEC   ?= examples/topologies/lab.yaml
PHASE  ?= 1
ROLE   ?=
FAULTS ?=
# Validation depth of deploy-phase: quick (acceptance suite), burnin (+ DCGM, gpu-burn, ib_write_bw),
# full (+ NCCL across nodes).
LEVEL  ?= full
# Molecule scenarios make test runs (3-10 min each on 2 cores), MOLECULE_JOBS at a time: they
# wait on apt, dpkg and systemd as much as on the CPU. The gate's lab deploys apply every other
# day-0/1 role through site.yml; make test-integration runs every scenario, one by one.
MOLECULE_GATE ?= base,nvidia_driver,slurm
MOLECULE_JOBS ?= 3
export CONTAINERS_CONF := $(CURDIR)/lab/containers.conf
export ANSIBLE_CONFIG  := $(CURDIR)/ansible.cfg

SYSTEM_PACKAGES := python3-venv podman runc debootstrap uidmap apt-utils gnupg dpkg-dev slirp4netns prometheus chromium munge

.PHONY: help
help: ## Show this help
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: setup
setup: $(STAMP) ## Create .venv and install gpuforge with pinned dependencies

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

.PHONY: system-deps
system-deps: ## Install the Debian packages the lab and Molecule need (root)
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

.PHONY: test
# The CI gate. Integration checks marked extended (the rolling upgrade on the day-2 lab) and the
# modules test-lab does not name (rollout, upgrade, scale-out, conformance) run in
# make test-integration only.
test: lint-python lint-ansible collection test-unit test-slow test-lab ## Lint (incl. ansible-lint), unit tests, lab integration tests, Molecule (MOLECULE_GATE)

.PHONY: test-unit
test-unit: setup system-deps ## Unit tests without the slow ones (no containers)
	$(BIN)/pytest -q tests/unit -n 2 -m "not slow"

.PHONY: test-slow
test-slow: setup system-deps ## Slow unit tests: real ansible-inventory on 10k hosts, random SIGKILL, mirror build
	$(BIN)/pytest -q tests/unit -m slow

.PHONY: test-lab
test-lab: setup system-deps lab-image ## Lab integration tests (lab, day 2, phase 1 then 2) and the Molecule scenarios of MOLECULE_GATE
	$(BIN)/pytest -q --durations=10 tests/integration/test_lab.py
	GPUFORGE_MOLECULE_ROLES=$(MOLECULE_GATE) $(BIN)/pytest -q --durations=20 -n $(MOLECULE_JOBS) --dist loadgroup \
	  -m "not extended" tests/integration/test_day2.py tests/integration/test_phases.py tests/integration/test_molecule.py

.PHONY: test-integration
test-integration: setup system-deps ## Molecule scenarios and lab integration tests (podman)
	$(BIN)/pytest -q tests/integration

.PHONY: lint
lint: lint-python lint-ansible ## Every linter

.PHONY: lint-python
lint-python: setup ## ruff, mypy --strict, yamllint; docs/health.md's Xid table in step with its data
	$(BIN)/ruff check src tests validators lab roles bench tools
	$(BIN)/ruff format --check src tests validators lab roles bench tools
	$(BIN)/mypy src
	$(BIN)/yamllint -s .
	$(PY) tools/xid_docs.py --check

.PHONY: lint-ansible
lint-ansible: setup ## ansible-lint (production profile); role READMEs in step with their argument specs
	$(BIN)/ansible-lint
	$(PY) tools/role_docs.py --check

.PHONY: collection
collection: setup ## Build the Ansible collection gpuforge.cluster (galaxy.yml) into build/collection/
	$(BIN)/ansible-galaxy collection build --force --output-path build/collection

.PHONY: bench
bench: setup ## Print measured performance figures
	$(PY) bench/topology_bench.py
	$(PY) bench/predict_bench.py
	$(PY) bench/health_collector_bench.py
	$(PY) bench/health_node_bench.py
	$(PY) bench/monitoring_bench.py
	$(PY) bench/conformance_bench.py
	$(PY) bench/site_play_bench.py
	LAB=d2exec REPEAT=1 $(PY) bench/site_play_bench.py --scaleout

.PHONY: deploy-phase
# With a lab spec (lab.yaml, lab-roce.yaml: named as their file), deploy-phase first brings that
# container lab up (idempotent) and deploys through its inventory.
LAB_SPECS := $(addprefix examples/topologies/,lab.yaml lab-roce.yaml)
IS_LAB := $(filter $(LAB_SPECS) $(addprefix $(CURDIR)/,$(LAB_SPECS)),$(SPEC))
LAB_DIR := .lab/$(basename $(notdir $(SPEC)))
deploy-phase: setup $(if $(IS_LAB),lab-up) ## Provision, validate and admit one rollout phase (PHASE=1 SPEC=lab)
	$(if $(IS_LAB),ANSIBLE_CONFIG=$(CURDIR)/$(LAB_DIR)/ansible.cfg) $(BIN)/gpuforge deploy --phase $(PHASE) --level $(LEVEL) $(SPEC) \
	  $(if $(IS_LAB),--inventory $(LAB_DIR)/inventory,$(if $(INVENTORY),--inventory $(INVENTORY)))

.PHONY: conformance
# CLUSTER names inventory/<CLUSTER> (or INVENTORY=dir); a lab's is .lab/<lab>/inventory.
CLUSTER ?= $(basename $(notdir $(SPEC)))
CONFORMANCE_LEVEL ?= quick
conformance: setup ## Nightly conformance now: one Slurm job array over the idle nodes, report of what changed (CLUSTER=, INVENTORY=, CONFORMANCE_LEVEL=, CONFORMANCE_ARGS=)
	$(BIN)/gpuforge conformance run --level $(CONFORMANCE_LEVEL) \
	  $(if $(INVENTORY),--inventory $(INVENTORY),$(if $(wildcard .lab/$(CLUSTER)/inventory),--inventory .lab/$(CLUSTER)/inventory,$(CLUSTER))) $(CONFORMANCE_ARGS)

.PHONY: upgrade
# Rolling upgrade to SPEC's pins (docs/upgrades.md); a lab's inventory and ansible.cfg are
# .lab/<CLUSTER>/ (CLUSTER=d2upg when SPEC is a copy under another file name).
UPGRADE_LEVEL ?= quick
upgrade: setup ## Move a live cluster to SPEC's pins wave by wave (CLUSTER=, INVENTORY=, UPGRADE_LEVEL=, UPGRADE_ARGS=)
	$(if $(wildcard .lab/$(CLUSTER)/ansible.cfg),ANSIBLE_CONFIG=$(CURDIR)/.lab/$(CLUSTER)/ansible.cfg) \
	  $(BIN)/gpuforge upgrade run --level $(UPGRADE_LEVEL) $(SPEC) \
	  $(if $(INVENTORY),--inventory $(INVENTORY),$(if $(wildcard .lab/$(CLUSTER)/inventory),--inventory .lab/$(CLUSTER)/inventory)) $(UPGRADE_ARGS)

.PHONY: lab-image
lab-image: setup system-deps ## Build the lab node image and the signed lab mirror (cached)
	$(BIN)/gpuforge lab image
	$(BIN)/gpuforge lab mirror

.PHONY: lab-up
lab-up: lab-image ## Bring up one container per node of SPEC (idempotent; FAULTS=file injects faults)
	$(BIN)/gpuforge lab up $(SPEC) $(if $(FAULTS),--faults $(FAULTS))

.PHONY: lab-down
lab-down: setup ## Remove the lab: containers, network, SSH key, state, rollout record (LAB=name if several)
	$(BIN)/gpuforge lab down $(if $(LAB),--lab $(LAB))

.PHONY: molecule
molecule: lab-image ## Run one role's Molecule scenario: make molecule ROLE=<role>
	@test -n "$(ROLE)" || { echo "usage: make molecule ROLE=<role>" >&2; exit 2; }
	cd roles/$(ROLE) && env -u ANSIBLE_CONFIG PATH="$(CURDIR)/$(BIN):$$PATH" \
	  GPUFORGE_MOLECULE_INSTANCE=gpuforge-molecule-$(ROLE) $(CURDIR)/$(BIN)/molecule test

.PHONY: clean
clean: ## Remove build outputs (keeps .venv)
	rm -rf build .pytest_cache .mypy_cache .ruff_cache
