"""Counts the tests of every part of `make test` (tools/matrix.sh) without
running one: pytest collects each part, the molecule scenarios against an
inventory of their own platforms (testinfra makes a test per host).
Usage: .venv/bin/python tools/count-tests.py
Prints a line per part, the tests all parts run, and the distinct tests: each
test once, however many hosts and ansible-core releases run it."""

import os
import pathlib
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
COLLECTIONS = os.environ.get("BATCHQ_COLLECTIONS_PATH", str(ROOT / ".cache" / "collections"))


def matrix_parts():
    """The parts of tools/matrix.sh, as its words: ['2.21', 'molecule', 'SCENARIOS=default'], ..."""
    text = (ROOT / "tools" / "matrix.sh").read_text()
    oldest, newest = re.search(r"oldest=(\S+) newest=(\S+)", text).groups()
    parts = re.findall(r'^\s+"(\$(?:oldest|newest) [^"]+|[0-9.]+ [^"]+)"$', text, re.M)
    return [part.replace("$oldest", oldest).replace("$newest", newest).split() for part in parts]


def platforms(scenario):
    """{host: its groups} of a scenario's platforms, named as molecule names them."""
    shared = yaml.safe_load((ROOT / ".config" / "molecule" / "config.yml").read_text())["platforms"]
    own = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text()) or {}
    return {p["name"].replace("${BATCHQ_HOST_PREFIX:-batchq}", "batchq").replace("${MOLECULE_SCENARIO_NAME}", scenario):
            p.get("groups", []) for p in own.get("platforms", shared)}


def collect(argv, env=None):
    # the venv's own ansible-inventory, which testinfra runs
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"] + argv,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=COLLECTIONS, PATH=path, **(env or {})),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False).stdout
    found = re.search(r"(\d+) tests? collected", out)
    if not found:
        raise SystemExit("pytest collected nothing from %s:\n%s" % (argv, out[-2000:]))
    ids = [line for line in out.splitlines() if "::" in line]
    assert len(ids) == int(found.group(1)), out[-2000:]
    return ids


def molecule(scenario, platform=None):
    hosts = {h: groups for h, groups in platforms(scenario).items() if platform is None or h.endswith("-" + platform)}
    children = {}
    for host, groups in hosts.items():
        for group in groups:
            children.setdefault(group, {"hosts": {}})["hosts"][host] = {}
    with tempfile.TemporaryDirectory() as folder:
        inventory = pathlib.Path(folder) / "inventory.yml"
        inventory.write_text(yaml.safe_dump({"all": {"hosts": dict.fromkeys(hosts, {}), "children": children}}))
        env = {"MOLECULE_INVENTORY_FILE": str(inventory), "MOLECULE_SCENARIO_DIRECTORY": str(ROOT / "molecule" / scenario)}
        return collect(["--ansible-inventory", str(inventory), "--connection", "ansible", "--hosts", "all",
                        "molecule/%s/tests" % scenario], env)


def without_host(test_id):
    """...::test_y[ansible://batchq-default-debian11-relative] -> ...::test_y[relative]"""
    test_id = re.sub(r"ansible://batchq-[a-z0-9]+-debian[a-z0-9]+|ansible://batchq-fleet-postgresql", "", test_id)
    return test_id.replace("[-", "[").replace("-]", "]").replace("[]", "")


def main():
    total, distinct = 0, set()
    for words in matrix_parts():
        ids = []
        options = dict(w.split("=", 1) for w in words if "=" in w)
        for target in [w for w in words[1:] if "=" not in w]:
            if target in ("unit", "pgqueue"):
                ids += collect(["tests/" + target])
            elif target == "molecule":
                ids += [i for s in options["SCENARIOS"].split() for i in molecule(s, options.get("PLATFORM"))]
            # sanity: ansible-test's own checks, not pytest tests
        print("%-52s %5d tests" % (" ".join(words), len(ids)))
        total += len(ids)
        distinct.update(without_host(i) for i in ids)
    print("%-52s %5d tests" % ("all parts", total))
    print("%-52s %5d tests" % ("distinct (each once, whatever its hosts and releases)", len(distinct)))


if __name__ == "__main__":
    main()
