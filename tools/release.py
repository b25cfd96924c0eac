"""The release checks and the release tarball.

Usage, through the Makefile, which installs the release venv first
(.cache/release-venv, requirements/release.txt) and runs this with its Python:
  make release-check
      builds a test tarball of the work tree (galaxy.yml's placeholder
      addresses allowed) and checks it as below; part of make test.
  make release REPOSITORY=https://... [HOMEPAGE=...] [DOCUMENTATION=...] [ISSUES=...]
      writes the addresses given into galaxy.yml (HOMEPAGE and DOCUMENTATION
      default to REPOSITORY, ISSUES to REPOSITORY/issues), refuses any
      placeholder left, builds the release tarball from HEAD (with that
      galaxy.yml) into .cache/release/ and checks it as below.
  python3 tools/release.py contents TARBALL
      what a tarball holds (the Makefile's check of every build).
The checks of a tarball: what it holds; galaxy-importer, Galaxy's import
checks (tools/galaxy-importer.cfg: ansible-doc, ansible-lint, no containers),
whose log may hold no warning but the expected ones (below); ansible-builder's
introspection of the installed collection (no Python or system requirement:
meta/execution-environment.yml); `ansible-builder create` on the execution
environment the tarball ships (docs/execution-environment.yml), and the
build context it writes.
"""

import filecmp
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parents[1]
ADDRESS_KEYS = ("repository", "documentation", "homepage", "issues")
# Top-level folders that only a clone needs: never in a tarball.
CLONE_ONLY = ("molecule", "tools", "requirements", "benchmarks", "demo", ".ci", ".cache", ".ansible", ".venv", ".config")
# Below tests/, a tarball holds ansible-test's files alone: the sanity ignore
# files and tests/config.yml (which Python the modules need).
TESTS_SHIPPED = re.compile(r"tests(/config\.yml|/sanity(/ignore-2\.[0-9]+\.txt)?)?")
# Reserved names (RFC 2606, RFC 6761): an address there is a placeholder.
RESERVED_HOST = re.compile(r"(^|\.)(invalid|example|test|localhost)$|(^|\.)example\.(com|org|net)$")
# ansible-lint, run by the importer, follows an import_playbook of one of this
# collection's playbooks (the examples' deploy.yml) through the collections
# path the importer gives it. The importer gives the ansible_collections folder
# itself and ansible-lint appends ansible_collections/... to it, so it finds
# nothing and logs this; its syntax check, through ansible-playbook, resolves
# the playbook, and the lint passes.
LINT_FOLLOW_MISS = re.compile(r"WARNING: ERROR +Failed to find batchq\.consumers\.\w+ playbook\.")


def fail(message):
    print("release: " + message, file=sys.stderr)
    sys.exit(1)


def cache_dir():
    return pathlib.Path(os.environ.get("BATCHQ_CACHE") or ROOT / ".cache")


def venv_bin():
    """The bin folder of the venv whose Python runs this (not resolved: a venv's python is a link)."""
    return pathlib.Path(sys.executable).parent


def is_placeholder(address):
    host = urllib.parse.urlsplit(address or "").hostname or ""
    return not address or bool(RESERVED_HOST.search(host))


def check_address(key, address):
    """An error message for an address that cannot be a release's, or None."""
    parts = urllib.parse.urlsplit(address)
    if parts.scheme != "https" or not parts.hostname or re.search(r"\s", address):
        return "%s %r is not an https:// address" % (key, address)
    if is_placeholder(address):
        return "%s %r is a placeholder (a reserved domain)" % (key, address)
    return None


def addresses_from(environ):
    """{key: address} from REPOSITORY, DOCUMENTATION, HOMEPAGE and ISSUES; {} when none is given."""
    given = {key: environ.get(key.upper(), "").strip() for key in ADDRESS_KEYS}
    if not any(given.values()):
        return {}
    repository = given["repository"]
    if not repository:
        fail("REPOSITORY=https://... is needed with the other addresses")
    repository = repository.rstrip("/")
    return {
        "repository": repository,
        "documentation": given["documentation"] or repository,
        "homepage": given["homepage"] or repository,
        "issues": given["issues"] or repository + "/issues",
    }


def with_addresses(text, addresses):
    """galaxy.yml's text with these addresses, every other line as it was."""
    for key, address in addresses.items():
        text, count = re.subn(r"^%s:.*$" % key, "%s: %s" % (key, address), text, flags=re.M)
        if count != 1:
            fail("galaxy.yml has %d lines %s:, not 1" % (count, key))
    return text


def galaxy_addresses(text):
    import yaml

    galaxy = yaml.safe_load(text)
    return {key: galaxy.get(key) or "" for key in ADDRESS_KEYS}


def run(command, check=True, **kwargs):
    return subprocess.run([str(word) for word in command], check=check, **kwargs)


def quiet(command, **kwargs):
    """Runs a command, showing what it printed only when it fails."""
    result = run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False, **kwargs)
    if result.returncode != 0:
        fail("%s failed (exit status %d):\n%s" % (" ".join(map(str, command)), result.returncode, result.stdout))
    return result.stdout


def contents(tarball):
    """Fails unless the tarball holds what a user needs and nothing only a clone needs."""
    with tarfile.open(tarball) as archive:
        names = {name.rstrip("/") for name in archive.getnames()}
    clone_only = sorted(name for name in names if name.split("/")[0] in CLONE_ONLY)
    tests = sorted(name for name in names if name.split("/")[0] == "tests" and not TESTS_SHIPPED.fullmatch(name))
    if clone_only or tests:
        fail("%s holds files only a clone needs (galaxy.yml's build_ignore): %s" % (tarball, " ".join(clone_only + tests)))
    needed = ["MANIFEST.json", "FILES.json", "LICENSE", "README.md", "roles/consumer/README.md", "meta/runtime.yml",
              "meta/execution-environment.yml", "docs/execution-environment.yml", "tests/config.yml"]
    missing = [name for name in needed if name not in names]
    if not any(re.fullmatch(r"tests/sanity/ignore-2\.[0-9]+\.txt", name) for name in names):
        missing.append("tests/sanity/ignore-*.txt")
    if missing:
        fail("%s lacks %s" % (tarball, " ".join(missing)))


def manifest(tarball):
    with tarfile.open(tarball) as archive:
        return json.load(archive.extractfile("MANIFEST.json"))["collection_info"]


def clean_env(work):
    """The environment of the tools: none of make's Ansible settings (ANSIBLE_HOME,
    the collections path of another build), an ANSIBLE_HOME of their own."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(("ANSIBLE_", "GALAXY_IMPORTER_"))}
    env["PATH"] = "%s:%s" % (venv_bin(), env.get("PATH", ""))
    env["ANSIBLE_HOME"] = str(work / "ansible-home")
    env["PYTHONWARNINGS"] = "ignore"
    return env


def importer(tarball, work):
    """galaxy-importer on the tarball: it must import it, and log no warning but the expected ones."""
    folder = work / "importer"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "tmp").mkdir(parents=True)
    env = clean_env(work)
    env.update(GALAXY_IMPORTER_CONFIG=str(ROOT / "tools" / "galaxy-importer.cfg"),
               GALAXY_IMPORTER_TMP_ROOT_DIR=str(folder / "tmp"),
               GALAXY_IMPORTER_ANSIBLE_LOCAL_TMP=str(folder / "tmp" / "ansible"))
    result = run([venv_bin() / "python", "-m", "galaxy_importer.main", tarball], cwd=folder, env=env,
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    (folder / "importer.log").write_text(result.stdout)
    lines = result.stdout.splitlines()
    expected = {}
    with tarfile.open(tarball) as archive:
        for member in archive.getmembers():
            match = re.fullmatch(r"tests/sanity/(ignore-.+\.txt)", member.name)
            if match:
                count = len(archive.extractfile(member).read().decode().splitlines(keepends=True))
                # the importer's notice of every ignore file, with its count of lines
                expected["WARNING: Ignore files skip ansible-test sanity tests, found %s with %d statement(s)"
                         % (match.group(1), count)] = 0
    unexpected = []
    for line in lines:
        if line in expected:
            expected[line] += 1
        elif LINT_FOLLOW_MISS.fullmatch(line):
            continue
        elif re.match(r"(WARNING|ERROR|CRITICAL|Traceback)\b", line) or "Error" in line:
            unexpected.append(line)
    if result.returncode != 0 or "Importer processing completed successfully" not in lines or unexpected:
        fail("galaxy-importer on %s (exit status %d), in %s:\n%s"
             % (tarball, result.returncode, folder / "importer.log", "\n".join(unexpected or lines[-20:])))
    missing = [line for line, seen in expected.items() if seen != 1]
    if missing:
        fail("galaxy-importer did not log what it logs of each ignore file:\n" + "\n".join(missing))

    data = json.loads((folder / "importer_result.json").read_text())
    info = manifest(tarball)
    for key in ADDRESS_KEYS:
        if data["metadata"][key] != info[key]:
            fail("galaxy-importer read %s %r, MANIFEST.json says %r" % (key, data["metadata"][key], info[key]))
    with tarfile.open(tarball) as archive:
        modules = {re.sub(r"^plugins/modules/(\w+)\.py$", r"\1", name) for name in archive.getnames()
                   if re.fullmatch(r"plugins/modules/\w+\.py", name)}
    found = {(item["content_type"], item["content_name"]): item for item in data["docs_blob"]["contents"]}
    undocumented = sorted(name for name in modules if not (found.get(("module", name)) or {}).get("doc_strings"))
    if not modules or undocumented:
        fail("galaxy-importer read no documentation of the modules %s" % " ".join(undocumented))
    if (found.get(("role", "consumer")) or {}).get("readme_file") != "README.md":
        fail("galaxy-importer found no README.md of the role consumer")
    print("galaxy-importer %s: imported; the modules' documentation (%d) and the role's README read; only the expected notices "
          "(%d ignore files, %d of ansible-lint's import_playbook lookups); log in %s"
          % (package_version("galaxy-importer"), len(modules), len(expected),
             sum(bool(LINT_FOLLOW_MISS.fullmatch(line)) for line in lines), folder / "importer.log"))


def package_version(name):
    from importlib.metadata import version

    return version(name)


def introspection(tarball, work):
    """ansible-builder's introspection of the installed tarball: no Python or system requirement."""
    import yaml

    collections = work / "collections"
    shutil.rmtree(collections, ignore_errors=True)
    env = clean_env(work)
    quiet([venv_bin() / "ansible-galaxy", "collection", "install", "--force", "-p", collections, tarball], env=env)
    meta = collections / "ansible_collections/batchq/consumers/meta/execution-environment.yml"
    definition = yaml.safe_load(meta.read_text())
    if definition != {"version": 3, "dependencies": {}}:
        fail("%s says %r, not version 3 without dependencies" % (meta, definition))
    output = quiet([venv_bin() / "ansible-builder", "introspect", collections], env=env)
    found = yaml.safe_load(output.split("---", 1)[1])
    if found != {"python": [], "system": []}:
        fail("ansible-builder introspect found requirements: %r" % (found,))
    print("ansible-builder introspect: no Python and no system requirement")


def build_context(tarball, work):
    """`ansible-builder create` on the execution environment the tarball ships, and what it wrote."""
    import yaml

    folder = work / "ee"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with tarfile.open(tarball) as archive:
        text = archive.extractfile("docs/execution-environment.yml").read()
    (folder / "execution-environment.yml").write_bytes(text)
    definition = yaml.safe_load(text)
    (extra,) = definition["additional_build_files"]
    if extra["src"] != tarball.name:
        fail("docs/execution-environment.yml adds %s; the build writes %s (galaxy.yml's version): name that"
             % (extra["src"], tarball.name))
    shutil.copy(tarball, folder / tarball.name)
    quiet([venv_bin() / "ansible-builder", "create", "-f", "execution-environment.yml", "-c", "context",
           "--output-filename", "Containerfile"], cwd=folder, env=clean_env(work))

    build = folder / "context" / "_build"
    problems = []
    copied = build / extra["dest"] / tarball.name
    if not copied.is_file() or not filecmp.cmp(copied, tarball, shallow=False):
        problems.append("%s is not the tarball" % copied)
    galaxy = definition["dependencies"]["galaxy"]
    if yaml.safe_load((build / "requirements.yml").read_text()) != galaxy:
        problems.append("_build/requirements.yml is not the definition's galaxy requirements")
    # The galaxy stage copies _build to /build and installs from there.
    if [item["name"] for item in galaxy["collections"]] != ["/build/%s/%s" % (extra["dest"], tarball.name)]:
        problems.append("the galaxy requirements do not install /build/%s/%s" % (extra["dest"], tarball.name))
    for name in ("requirements.txt", "bindep.txt"):
        if (build / name).exists():
            problems.append("_build/%s: the definition names no Python or system package" % name)
    scripts = {path.name for path in (build / "scripts").iterdir()}
    for script in ("introspect.py", "assemble", "install-from-bindep", "check_galaxy", "check_ansible", "pip_install"):
        if script not in scripts:
            problems.append("no _build/scripts/" + script)
    containerfile = (folder / "context" / "Containerfile").read_text()
    dependencies = definition["dependencies"]
    for line in (
        'ARG EE_BASE_IMAGE="%s"' % definition["images"]["base_image"]["name"],
        'ARG PYCMD="%s"' % dependencies["python_interpreter"]["python_path"],
        'ARG ANSIBLE_INSTALL_REFS="%s %s"' % (dependencies["ansible_core"]["package_pip"],
                                              dependencies["ansible_runner"]["package_pip"]),
        "RUN $PKGMGR install $PYPKG -y",
        "COPY _build /build",
        'collection install $ANSIBLE_GALAXY_CLI_COLLECTION_OPTS -r requirements.yml --collections-path "/usr/share/ansible/collections"',
        "introspect.py introspect --write-bindep=/tmp/src/bindep.txt --write-pip=/tmp/src/requirements.txt",
    ):
        if line not in containerfile:
            problems.append("the Containerfile lacks %r" % line)
    if problems:
        fail("ansible-builder create, in %s:\n%s" % (folder, "\n".join(problems)))
    print("ansible-builder %s create: %s and _build/ hold the tarball, its galaxy requirements and the scripts"
          % (package_version("ansible-builder"), folder / "context" / "Containerfile"))


def verify(tarball, work, release):
    contents(tarball)
    info = manifest(tarball)
    for key in ADDRESS_KEYS:
        problem = check_address(key, info.get(key) or "") if release else (None if info.get(key) else key + " is empty")
        if problem:
            fail("%s: %s" % (tarball, problem))
    importer(tarball, work)
    introspection(tarball, work)
    build_context(tarball, work)


def build(source, output, env):
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    quiet([venv_bin() / "ansible-galaxy", "collection", "build", "--force", "--output-path", output, source], env=env)
    (tarball,) = output.glob("*.tar.gz")
    return tarball


def check():
    work = cache_dir() / "release-check"
    tarball = build(ROOT, work / "build", clean_env(work))
    print("test tarball: %s" % tarball)
    verify(tarball, work, release=False)


def release():
    galaxy_yml = ROOT / "galaxy.yml"
    text = galaxy_yml.read_text()
    given = addresses_from(os.environ)
    for key, address in given.items():
        problem = check_address(key, address)
        if problem:
            fail(problem)
    # The release is HEAD's files, with galaxy.yml's addresses: nothing else may be uncommitted.
    changed = run(["git", "diff", "--name-only", "HEAD", "--", ".", ":(exclude)galaxy.yml"], cwd=ROOT,
                  stdout=subprocess.PIPE, text=True).stdout.split()
    if changed:
        fail("uncommitted changes (the release is built from HEAD): " + " ".join(changed))
    committed = run(["git", "show", "HEAD:galaxy.yml"], cwd=ROOT, stdout=subprocess.PIPE, text=True).stdout
    if with_addresses(committed, galaxy_addresses(text)) != text:
        fail("galaxy.yml differs from HEAD's in more than its addresses: commit that first")
    if given:
        text = with_addresses(text, given)
        galaxy_yml.write_text(text)
        print("galaxy.yml: %s" % ", ".join("%s %s" % item for item in given.items()))
    problems = [check_address(key, address) for key, address in galaxy_addresses(text).items()]
    problems = [problem for problem in problems if problem]
    if problems:
        fail("no release tarball with placeholder addresses in galaxy.yml: %s. Give the project's: "
             "make release REPOSITORY=https://... [HOMEPAGE=...] [DOCUMENTATION=...] [ISSUES=...]" % "; ".join(problems))

    work = cache_dir() / "release"
    source = work / "source"
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    archive = run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, stdout=subprocess.PIPE).stdout
    run(["tar", "-x", "-C", source], input=archive)
    (source / "galaxy.yml").write_text(text)
    tarball = build(source, work / "dist", clean_env(work))
    verify(tarball, work, release=True)
    digest = run(["sha256sum", tarball], stdout=subprocess.PIPE, text=True).stdout.split()[0]
    head = run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, stdout=subprocess.PIPE, text=True).stdout.strip()
    print("release tarball: %s (sha256 %s), from %s" % (tarball, digest, head))
    if text != committed:
        print("galaxy.yml now holds the addresses: commit it, then tag the commit (CONTRIBUTING.md: Releasing)")


def main(argv):
    if argv[1:2] == ["check"] and len(argv) == 2:
        check()
    elif argv[1:2] == ["release"] and len(argv) == 2:
        release()
    elif argv[1:2] == ["contents"] and len(argv) == 3:
        contents(pathlib.Path(argv[2]))
    else:
        fail("usage: tools/release.py check | release | contents TARBALL (see its first lines)")


if __name__ == "__main__":
    main(sys.argv)
