# On a fresh Debian machine, `make demo` and `make test` install what they need.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3.11
VENV := .venv
BIN := $(abspath $(VENV))/bin
CACHE := $(abspath .cache)
VERSION := $(shell awk '/^version:/ {print $$2}' galaxy.yml)
TARBALL := $(CACHE)/build/batchq-consumers-$(VERSION).tar.gz
SCENARIOS ?= default info faults drain fleet

# Everything below runs the collection as users install it: the built tarball.
export PATH := $(BIN):$(PATH)
export BATCHQ_COLLECTIONS_PATH := $(CACHE)/collections
export ANSIBLE_COLLECTIONS_PATH := $(CACHE)/collections
export ANSIBLE_FORCE_COLOR := false
# ansible-lint installs the collection it lints into ANSIBLE_HOME: keep that
# copy here, not in the user's home where it would outlive the next build.
export ANSIBLE_HOME := $(CACHE)/ansible-home

.PHONY: test demo demo-down lint sanity unit rules molecule images engine collection clean

test: lint sanity unit rules molecule

demo: collection images
	tools/demo.sh up

demo-down: $(VENV)/.installed
	tools/demo.sh down

$(VENV)/.installed: requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-test.txt
	touch $@

engine:
	tools/docker-engine.sh

images: engine
	tools/build-image.sh bookworm
	tools/build-image.sh trixie
	tools/build-image.sh bookworm batchq/postgresql:bookworm postgresql

collection: $(VENV)/.installed
	rm -rf $(CACHE)/build $(CACHE)/collections/ansible_collections/batchq $(ANSIBLE_HOME)/collections
	ansible-galaxy collection build --force --output-path $(CACHE)/build . >/dev/null
	@! tar -tzf $(TARBALL) | grep -E '^(molecule|tests|tools|\.ci)/' || { echo "test files in the tarball" >&2; exit 1; }
	ansible-galaxy collection install --force -p $(CACHE)/collections $(TARBALL) >/dev/null
	@echo "installed $(TARBALL)"

lint: collection
	yamllint --strict .
	ansible-lint
	@for plugin in module:consumer_info module:consumer_units module:consumer_files role:consumer filter:consumers \
	    filter:consumer_leftovers filter:consumer_metrics_files \
	    filter:consumer_status_table filter:consumer_status_problems; do \
	  ansible-doc --json -t $${plugin%%:*} batchq.consumers.$${plugin#*:} | grep -q '"doc"' \
	    || ansible-doc --json -t $${plugin%%:*} batchq.consumers.$${plugin#*:} | grep -q '"entry_points"' \
	    || { echo "ansible-doc does not render $$plugin" >&2; exit 1; }; \
	done; echo "ansible-doc renders every plugin and the role"

sanity: $(VENV)/.installed
	tools/sanity.sh

unit: collection
	PYTHONPATH=$(CACHE)/collections pytest tests/unit

# The example alert rules, checked and unit-tested by Prometheus' own promtool.
rules:
	tools/promtool.sh check rules examples/prometheus/*.rules.yml
	tools/promtool.sh test rules tests/prometheus/*.test.yml

molecule: collection images
	for scenario in $(SCENARIOS); do molecule test --scenario-name $$scenario; done

clean: demo-down
	rm -rf $(CACHE) $(VENV)
