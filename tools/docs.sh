#!/usr/bin/env bash
# Builds the docs site (`make docs`) or lints it (`make lint`).
# Usage: tools/docs.sh build|lint
#   build: antsibull-docs writes the reference of the role, modules and filters
#          and the changelog page (docs/docsite/config.yml), and copies the guides
#          of docs/docsite/rst/ from the installed collection (the built tarball,
#          as users get it), with the settings of tools/docs/antsibull-docs.cfg;
#          then Sphinx turns it into HTML in .cache/docs/html (index.html).
#   lint:  antsibull-docs lint-collection-docs on this tree (plugin and role docs,
#          the guides' labels, docs/docsite/links.yml and extra-docs.yml), then the
#          build, in which every warning fails (a reference or a label that does not
#          resolve, an image that is not there, a malformed table).
# Offline: nothing is fetched (no intersphinx, tools/docs/conf.py). The tools come
# from requirements/docs.txt in .cache/docs-venv (DOCS_VENV); the Makefile
# installs them and the collection first.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${DOCS_VENV:-$PWD/.cache/docs-venv}
out=${DOCS_OUT:-${BATCHQ_CACHE:-$PWD/.cache}/docs}
installed=${ANSIBLE_COLLECTIONS_PATH:?run through make}/ansible_collections/batchq/consumers
export PATH=$venv/bin:$PATH
export ANSIBLE_COLLECTIONS_PATH

build() {
  rm -rf "$out/rst" "$out/html"
  mkdir -p "$out/rst"
  chmod og-w "$out/rst"  # antsibull-docs refuses a folder others may write to
  antsibull-docs --config-file tools/docs/antsibull-docs.cfg collection --use-current --squash-hierarchy --fail-on-error \
    --no-add-antsibull-docs-version --dest-dir "$out/rst" batchq.consumers >"$out/antsibull-docs.log" 2>&1 \
    || { cat "$out/antsibull-docs.log" >&2; exit 1; }
  # antsibull-docs copies the guides' .rst files only: their pictures follow them.
  cp -r "$installed/docs/docsite/rst/images" "$out/rst/docsite/"
  # Labels of the Ansible documentation that the generated pages point to.
  cp tools/docs/ansible_references.rst "$out/rst/"
  sphinx-build -q -b html -c tools/docs -W --keep-going -n "$out/rst" "$out/html"
  # The collection is not published: every reference page links to the
  # install guide (tools/docs/antsibull-docs.cfg).
  test -f "$out/html/docsite/guide_installing.html"
  for page in "$out"/html/*_module.html "$out"/html/*_filter.html "$out"/html/*_role.html; do
    grep -q 'href="docsite/guide_installing.html"' "$page" \
      || { echo "docs: $page does not link to the install guide" >&2; exit 1; }
  done
  # The internal plugins sit apart from the public reference, after it
  # (tools/docs/conf.py moves them by the "Internal: " of their short description).
  awk '/<section id="internal-plugins"/ {found = 1; exit} / -- Internal: / {print "docs: public, but marked internal: " $0; bad = 1}
       END {exit bad || !found}' "$out/html/index.html" \
    || { echo "docs: the index has no section of internal plugins, or lists one in the public reference" >&2; exit 1; }
  echo "docs: $out/html/index.html"
}

case ${1:-} in
  build) build ;;
  lint)
    antsibull-docs lint-collection-docs --plugin-docs --check-extra-docs-refs \
      --validate-collection-refs self --disallow-unknown-collection-refs .
    build
    ;;
  *) echo "usage: tools/docs.sh build|lint" >&2; exit 2 ;;
esac
