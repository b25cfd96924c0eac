#!/usr/bin/env bash
# Runs `ansible-test sanity` twice: on the collection as it ships, and on the
# files of the tree that do not ship (the tests, tools, benchmarks, demo).
# Usage: tools/sanity.sh TARBALL [ANSIBLE-TEST SANITY OPTIONS...]
#   (`make sanity` gives the tarball `make collection` built.)
# 1. The tarball, unpacked below .cache/sanity/tarball: what users install.
#    ansible-test reads tests/sanity/ignore-X.Y.txt and tests/config.yml there,
#    so both ship (galaxy.yml's build_ignore), and those ignore files name
#    shipped files alone (ansible-test fails on an entry for a missing file).
# 2. A copy of the tree's files (git's, untracked ones too, not the ignored),
#    below .cache/sanity/tree, limited to the files the tarball lacks. Their
#    ignore entries are in tools/sanity-tree-ignore.txt, added there to each
#    ignore file. Both runs share ansible-test's virtual environments.
# ansible-test wants the collection below ansible_collections/NAMESPACE/NAME,
# and bootstraps pip in its virtual environments with a script it downloads
# from a host this machine cannot reach. (The shebangs ignored are python3 on
# purpose: Debian hosts have no "python".) The script below stands in for it:
# it installs pip from the wheel Python ships (ensurepip), then runs pip with
# ansible-test's arguments, which install the pip version it wants from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
tarball=$(realpath "${1:?usage: tools/sanity.sh TARBALL [ANSIBLE-TEST SANITY OPTIONS...]}")
shift
# Without shellcheck, ansible-test skips the check of the shell scripts.
command -v shellcheck >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null; }
cache=${BATCHQ_CACHE:-$PWD/.cache}/sanity
shipped=$cache/tarball/ansible_collections/batchq/consumers
tree=$cache/tree/ansible_collections/batchq/consumers
home=$cache/home

rm -rf "$cache/tarball" "$cache/tree" && mkdir -p "$shipped" "$tree"
tar -xzf "$tarball" -C "$shipped"
git -C "$shipped" init -q && git -C "$shipped" add -A
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$tree"
for ignore in "$tree"/tests/sanity/ignore-*.txt; do cat tools/sanity-tree-ignore.txt >>"$ignore"; done
git -C "$tree" init -q && git -C "$tree" add -A
# The tree's files that the tarball lacks (FILES.json and MANIFEST.json are the build's own).
mapfile -t unshipped < <(comm -23 <(git -C "$tree" ls-files | sort) <(git -C "$shipped" ls-files | sort))

mkdir -p "$home/.ansible/test/cache"
# The pip version that the installed ansible-core bootstraps: each release pins its own.
python=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
pip_version=$(python3 - <<'PY'
import pathlib, re, ansible_test
source = pathlib.Path(ansible_test.__file__).parent / "_internal/python_requirements.py"
print(re.search(r"pip='([^']+)'", source.read_text()).group(1))
PY
)
cat >"$home/.ansible/test/cache/get_pip_${pip_version//./_}.py" <<'PY'
import ensurepip
import os
import runpy
import sys

ensurepip.bootstrap()
os.environ.pop("PIP_CONFIG_FILE", None)  # ensurepip hides pip's config, which holds the machine's CA
sys.argv = ["pip", "install"] + [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
runpy.run_module("pip", run_name="__main__", alter_sys=True)
PY

echo "ansible-test sanity on $tarball ($(git -C "$shipped" ls-files | wc -l) files)"
(cd "$shipped" && HOME=$home ansible-test sanity --python "$python" --requirements "$@")
echo "ansible-test sanity on the tree's files that do not ship (${#unshipped[@]} files)"
(cd "$tree" && HOME=$home ansible-test sanity --python "$python" --requirements "$@" "${unshipped[@]}")
