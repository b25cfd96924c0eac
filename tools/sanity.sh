#!/usr/bin/env bash
# Runs `ansible-test sanity` on the collection's tracked files.
# ansible-test wants the collection below ansible_collections/NAMESPACE/NAME,
# and bootstraps pip in its virtual environments with a script it downloads
# from a host this machine cannot reach. (The probe's and batchq-drain's shebang is python3 on
# purpose: the Debian test containers have no "python"; see tests/sanity/.) The script below stands in for it:
# it installs pip from the wheel Python ships (ensurepip), then runs pip with
# ansible-test's arguments, which install the pip version it wants from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
# Without shellcheck, ansible-test skips the check of the shell scripts.
command -v shellcheck >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null; }
cache=${BATCHQ_CACHE:-$PWD/.cache}/sanity
tree=$cache/ansible_collections/batchq/consumers
home=$cache/home

rm -rf "$tree" && mkdir -p "$tree"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$tree"
git -C "$tree" init -q && git -C "$tree" add -A

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

cd "$tree"
HOME=$home ansible-test sanity --python "$python" --requirements "$@"
