# On a fresh Debian machine, `make demo`, `make docs` and `make test` install what they need.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3.11
# tools/ansible-core.sh gives each ansible-core its own venv, pins and cache.
VENV ?= .venv
REQUIREMENTS ?= requirements-test.txt
BIN := $(abspath $(VENV))/bin
CACHE ?= $(abspath .cache)
VERSION := $(shell awk '/^version:/ {print $$2}' galaxy.yml)
TARBALL := $(CACHE)/build/batchq-consumers-$(VERSION).tar.gz
# The docs site's tools (antsibull-docs, Sphinx, matplotlib) in a venv of their own.
DOCS_VENV ?= $(CACHE)/docs-venv
# The queue examples' tests (requirements/queues.txt: boto3, moto, hypothesis) in a venv of their own.
QUEUES_VENV ?= $(CACHE)/queues-venv
# Debian 11's boto3 and botocore (requirements/queues-debian11.txt): batchq-sqs runs under them too.
DEBIAN11_VENV ?= $(CACHE)/queues-debian11-venv
# galaxy-importer and ansible-builder (requirements/release.txt) in a venv of their own.
RELEASE_VENV ?= $(CACHE)/release-venv
SCENARIOS ?= default info faults drain fleet capacity
# The controller for ansible-core 2.20 and later, which need Python 3.12+.
CONTROLLER_IMAGE ?= batchq/controller:trixie

# Everything below runs the collection as users install it: the built tarball.
export PATH := $(BIN):$(PATH)
export BATCHQ_COLLECTIONS_PATH := $(CACHE)/collections
export ANSIBLE_COLLECTIONS_PATH := $(CACHE)/collections
export ANSIBLE_FORCE_COLOR := false
# ansible-lint installs the collection it lints into ANSIBLE_HOME: keep that
# copy here, not in the user's home where it would outlive the next build.
export ANSIBLE_HOME := $(CACHE)/ansible-home
export BATCHQ_CACHE := $(CACHE)
# A test run leaves no bytecode in the tree (nor a pytest cache: -p no:cacheprovider,
# as molecule's verifier runs it), and hypothesis keeps its examples below CACHE.
export PYTHONDONTWRITEBYTECODE := 1
export HYPOTHESIS_STORAGE_DIRECTORY := $(CACHE)/hypothesis
export DOCS_VENV

.PHONY: test matrix demo demo-down docs lint changelog sanity unit pgqueue queues rules molecule images controller-image engine collection docs-collection release-check release clean

# lint and the alert rules once, while the images build; unit, sanity and
# molecule under every supported ansible-core (tools/matrix.sh).
test:
	MATRIX_LINT=1 tools/matrix.sh

matrix:
	tools/matrix.sh

demo: collection images
	tools/demo.sh up

demo-down:
	tools/demo.sh down

# A pinned file lists every package, so --no-deps installs exactly that set
# (and lets a pre-release core sit beside an ansible that pins an older one).
# --no-compile: pip would compile every file of the ansible package (about
# 30 CPU-s a venv, and `make test` installs seven); Python compiles the few
# modules a run imports, once, on first import.
$(VENV)/.installed: $(REQUIREMENTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-compile -r $(REQUIREMENTS)
	touch $@

$(QUEUES_VENV)/.installed: requirements/queues.txt
	$(PYTHON) -m venv $(QUEUES_VENV)
	$(QUEUES_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -r requirements/queues.txt
	touch $@

$(DEBIAN11_VENV)/.installed: requirements/queues-debian11.txt
	$(PYTHON) -m venv $(DEBIAN11_VENV)
	$(DEBIAN11_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -r requirements/queues-debian11.txt
	touch $@

$(RELEASE_VENV)/.installed: requirements/release.txt
	$(PYTHON) -m venv $(RELEASE_VENV)
	$(RELEASE_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-compile -r requirements/release.txt
	touch $@

$(DOCS_VENV)/.installed: requirements/docs.txt
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -r requirements/docs.txt
	touch $@

engine:
	tools/docker-engine.sh

# The test hosts: one image per Debian, a bare one (systemd and python3 alone)
# for 11, 12 and 13, and the fleet's database. The bare images build first,
# three at once, and the others start from them (tools/build-image.sh).
BARE_IMAGES := --bare,bullseye --bare,bookworm --bare,trixie
IMAGES := forky bullseye bookworm trixie bookworm,batchq/postgresql:bookworm,postgresql
images: engine
	printf '%s\n' $(BARE_IMAGES) | tr , ' ' | xargs -P 3 -L 1 tools/build-image.sh
	printf '%s\n' $(IMAGES) | tr , ' ' | xargs -P 3 -L 1 tools/build-image.sh

controller-image: engine
	tools/build-image.sh trixie $(CONTROLLER_IMAGE) python3-venv,docker-cli,make,git,shellcheck,ca-certificates

# Builds the tarball and installs it below CACHE, with the ansible-galaxy given.
define build_collection
	rm -rf $(CACHE)/build $(CACHE)/collections/ansible_collections/batchq $(ANSIBLE_HOME)/collections
	$(1) collection build --force --output-path $(CACHE)/build . >/dev/null
	python3 tools/release.py contents $(TARBALL)
	$(1) collection install --force -p $(CACHE)/collections $(TARBALL) >/dev/null
	@echo "installed $(TARBALL)"
endef

collection: $(VENV)/.installed
	$(call build_collection,ansible-galaxy)

# The same tarball for the docs alone, built with the docs venv's ansible-core
# (requirements/docs.txt): make docs never installs the test venv.
docs-collection: $(DOCS_VENV)/.installed
	$(call build_collection,$(DOCS_VENV)/bin/ansible-galaxy)

# The docs site in .cache/docs/html, from the installed tarball (tools/docs.sh).
docs: docs-collection
	tools/docs.sh build

lint: collection $(DOCS_VENV)/.installed
	yamllint --strict .
	# ansible-lint lints this tree, as installed into its cache (ANSIBLE_HOME,
	# .ansible-lint), not the tarball installed below CACHE for the tests.
	env -u ANSIBLE_COLLECTIONS_PATH ansible-lint
	antsibull-changelog lint
	tools/changelog.sh check
	tools/docs.sh lint

# Galaxy's importer, ansible-builder's introspection and an execution
# environment's build context, on a tarball of the work tree built with the
# placeholder addresses of galaxy.yml (tools/release.py; make test runs it).
release-check: $(RELEASE_VENV)/.installed
	$(RELEASE_VENV)/bin/python tools/release.py check

# The release tarball in .cache/release/dist, from HEAD, with the project's
# addresses: make release REPOSITORY=https://... [HOMEPAGE=...] [DOCUMENTATION=...]
# [ISSUES=...] writes them into galaxy.yml. It refuses placeholders, then checks
# the tarball as release-check does (CONTRIBUTING.md: Releasing).
release: $(RELEASE_VENV)/.installed
	REPOSITORY='$(REPOSITORY)' HOMEPAGE='$(HOMEPAGE)' DOCUMENTATION='$(DOCUMENTATION)' ISSUES='$(ISSUES)' \
	  $(RELEASE_VENV)/bin/python tools/release.py release

# CHANGELOG.rst and changelogs/changelog.yaml from the fragments (tools/changelog.sh).
changelog: $(VENV)/.installed
	tools/changelog.sh update

# ansible-test sanity on the built tarball, unpacked (tools/sanity.sh).
sanity: collection
	tools/sanity.sh $(TARBALL)

unit: collection
	PYTHONPATH=$(CACHE)/collections pytest -p no:cacheprovider tests/unit

# The PostgreSQL example's programs against a real server (Debian 12's, in a
# container of the fleet's image; clients with psycopg2 and psycopg 3), no systemd.
pgqueue: $(VENV)/.installed images
	pytest -p no:cacheprovider --durations=15 tests/pgqueue

# The queue library, the SQS and spool examples (examples/queue_library, examples/sqs_queue,
# examples/spool_queue) against an in-memory queue, a strict fake of SQS, a moto server on
# 127.0.0.1 and spools in temporary folders.
queues: $(QUEUES_VENV)/.installed $(DEBIAN11_VENV)/.installed
	$(QUEUES_VENV)/bin/pyflakes examples/queue_library examples/sqs_queue examples/spool_queue \
	  examples/postgresql_queue tests/queues tests/pgqueue \
	  examples/sqs_queue/batchq-sqs examples/sqs_queue/batchq-sqs-enqueue \
	  examples/spool_queue/batchq-spool examples/spool_queue/batchq-spool-enqueue \
	  examples/postgresql_queue/batchq-pgqueue examples/postgresql_queue/batchq-pgqueue-enqueue
	DEBIAN11_PYTHON=$(abspath $(DEBIAN11_VENV))/bin/python \
	  $(QUEUES_VENV)/bin/python -m pytest -p no:cacheprovider --durations=15 tests/queues

# The example alert rules, checked and unit-tested by Prometheus' own promtool.
rules:
	tools/promtool.sh check rules examples/prometheus/*.rules.yml
	tools/promtool.sh test rules tests/prometheus/*.test.yml

# PLATFORM=debian11 (or debian12, debian13, debiantesting) runs a scenario on that host alone.
molecule: collection images
	# Each scenario keeps its state below CACHE: two ansible-cores may run it at once.
	for scenario in $(SCENARIOS); do \
	  MOLECULE_EPHEMERAL_DIRECTORY=$(CACHE)/molecule/$$scenario molecule test --scenario-name $$scenario \
	    $(if $(PLATFORM),--platform-name $${BATCHQ_HOST_PREFIX:-batchq}-$$scenario-$(PLATFORM)); \
	done

clean: demo-down
	rm -rf $(CACHE) $(VENV)
