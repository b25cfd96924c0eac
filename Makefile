# On a fresh Debian machine, `make demo` and `make test` install what they need.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3.11
VENV := .venv
BIN := $(abspath $(VENV))/bin
CACHE := $(abspath .cache)
VERSION := $(shell awk '/^version:/ {print $$2}' galaxy.yml)
TARBALL := $(CACHE)/build/batchq-consumers-$(VERSION).tar.gz
SCENARIOS ?= default

# Everything below runs the collection as users install it: the built tarball.
export PATH := $(BIN):$(PATH)
export BATCHQ_COLLECTIONS_PATH := $(CACHE)/collections
export ANSIBLE_COLLECTIONS_PATH := $(CACHE)/collections
export ANSIBLE_FORCE_COLOR := false

.PHONY: test demo demo-down lint unit molecule images engine collection clean

test: lint unit molecule

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

collection: $(VENV)/.installed
	rm -rf $(CACHE)/build $(CACHE)/collections/ansible_collections/batchq
	ansible-galaxy collection build --force --output-path $(CACHE)/build . >/dev/null
	@! tar -tzf $(TARBALL) | grep -E '^(molecule|tests|tools|\.ci)/' || { echo "test files in the tarball" >&2; exit 1; }
	ansible-galaxy collection install --force -p $(CACHE)/collections $(TARBALL) >/dev/null
	@echo "installed $(TARBALL)"

lint: collection
	yamllint --strict .
	ansible-lint

unit: $(VENV)/.installed
	PYTHONPATH=$(CACHE)/collections pytest tests/unit

molecule: collection images
	for scenario in $(SCENARIOS); do molecule test --scenario-name $$scenario; done

clean: demo-down
	rm -rf $(CACHE) $(VENV)
