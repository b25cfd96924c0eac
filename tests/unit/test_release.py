"""The release metadata and tools/release.py's rules, without building anything.

make release-check (in make test) builds a tarball and runs galaxy-importer,
ansible-builder and the tarball's own checks on it; these tests fail earlier,
on the files themselves.
"""

import fnmatch
import importlib.util
import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).parents[2]
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
IGNORE_LINE = re.compile(r"(?P<path>\S+) (?P<test>[a-z0-9-]+(:[A-Za-z0-9-]+)?) # (?P<reason>\S.*)")


def load_release():
    spec = importlib.util.spec_from_file_location("release", ROOT / "tools" / "release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


release = load_release()


def ships(path):
    """Whether galaxy.yml's build_ignore lets this file of the tree into the tarball."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:count]) for count in range(1, len(parts) + 1)]
    return not any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes for pattern in GALAXY["build_ignore"])


def supported_minors():
    """2.N for every ansible-core release from meta/runtime.yml's lowest to the newest tested."""
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
    lowest = int(re.fullmatch(r">=2\.(\d+)\.\d+", runtime["requires_ansible"]).group(1))
    newest = max(int(re.match(r"ansible-core-2\.(\d+)\.", path.name).group(1))
                 for path in (ROOT / "requirements").glob("ansible-core-2.*.txt"))
    return ["2.%d" % minor for minor in range(lowest, newest + 1)]


def test_an_ignore_file_for_every_ansible_core_in_the_range():
    minors = supported_minors()
    assert "2.17" in minors  # no 2.17 is pinned in requirements/, but it is in the range
    found = sorted(path.name for path in (ROOT / "tests" / "sanity").glob("ignore-*.txt"))
    assert found == sorted("ignore-%s.txt" % minor for minor in minors)


@pytest.mark.parametrize("path", sorted((ROOT / "tests" / "sanity").glob("ignore-*.txt")) +
                         [ROOT / "tools" / "sanity-tree-ignore.txt"], ids=lambda path: path.name)
def test_every_ignore_line_names_an_existing_file_and_gives_its_reason(path):
    shipped = path.parent.name == "sanity"
    for line in path.read_text().splitlines():
        match = IGNORE_LINE.fullmatch(line)
        assert match, line
        assert (ROOT / match["path"]).is_file(), line
        # The shipped files name shipped files alone: ansible-test fails on an entry for a missing file.
        assert ships(match["path"]) == shipped, line


def test_the_sanity_files_ship_and_the_other_tests_do_not():
    assert ships("tests/sanity/ignore-2.16.txt") and ships("tests/config.yml")
    for path in ROOT.glob("tests/*/**/*"):
        if path.is_file() and "__pycache__" not in path.parts and path.parts[-3:-1] != ("tests", "sanity"):
            assert not ships(path.relative_to(ROOT).as_posix()), path


@pytest.mark.parametrize("address", [
    "https://example.invalid/batchq/consumers", "https://example.org/x", "https://git.example.com/x",
    "https://forge.test/x", "https://localhost/x", "https://anything.example/x", "",
])
def test_placeholders_are_refused_for_a_release(address):
    assert release.is_placeholder(address)
    assert release.check_address("repository", address)


@pytest.mark.parametrize("address", ["http://git.corp.net/batchq", "git@git.corp.net:batchq.git", "https://",
                                     "https://git.corp.net/batchq consumers"])
def test_only_https_addresses_are_taken(address):
    assert release.check_address("repository", address)


def test_a_real_address_is_taken():
    assert release.check_address("issues", "https://git.corp.net/platform/batchq-consumers/issues") is None


def test_galaxy_yml_has_every_address_and_they_are_placeholders_until_a_release():
    assert set(release.ADDRESS_KEYS) <= set(GALAXY)
    assert all(release.is_placeholder(GALAXY[key]) for key in release.ADDRESS_KEYS)


def test_the_repository_gives_the_other_addresses():
    assert release.addresses_from({"REPOSITORY": "https://git.corp.net/batchq/"}) == {
        "repository": "https://git.corp.net/batchq",
        "documentation": "https://git.corp.net/batchq",
        "homepage": "https://git.corp.net/batchq",
        "issues": "https://git.corp.net/batchq/issues",
    }
    given = release.addresses_from({"REPOSITORY": "https://a.corp.net/b", "ISSUES": "https://bugs.corp.net/b",
                                    "DOCUMENTATION": "https://docs.corp.net/b"})
    assert given["issues"] == "https://bugs.corp.net/b" and given["documentation"] == "https://docs.corp.net/b"
    assert release.addresses_from({"HOME": "/root"}) == {}


def test_writing_the_addresses_changes_those_four_lines_alone():
    text = (ROOT / "galaxy.yml").read_text()
    given = release.addresses_from({"REPOSITORY": "https://git.corp.net/batchq"})
    written = release.with_addresses(text, given)
    assert release.galaxy_addresses(written) == given
    changed = [(old, new) for old, new in zip(text.splitlines(), written.splitlines()) if old != new]
    assert len(text.splitlines()) == len(written.splitlines()) and len(changed) == 4
    assert all(old.split(":")[0] in release.ADDRESS_KEYS for old, new in changed)
    assert {key: value for key, value in yaml.safe_load(written).items() if key not in release.ADDRESS_KEYS} == \
        {key: value for key, value in GALAXY.items() if key not in release.ADDRESS_KEYS}


def test_the_collection_says_it_needs_no_python_or_system_package():
    assert yaml.safe_load((ROOT / "meta" / "execution-environment.yml").read_text()) == {"version": 3, "dependencies": {}}


def test_the_execution_environment_shown_installs_this_version():
    definition = yaml.safe_load((ROOT / "docs" / "execution-environment.yml").read_text())
    tarball = "batchq-consumers-%s.tar.gz" % GALAXY["version"]
    (extra,) = definition["additional_build_files"]
    assert extra["src"] == tarball
    assert definition["dependencies"]["galaxy"]["collections"] == [
        {"name": "/build/%s/%s" % (extra["dest"], tarball), "type": "file"}]


def test_the_tarball_check_refuses_test_files_but_the_sanity_ones():
    assert release.TESTS_SHIPPED.fullmatch("tests/sanity/ignore-2.17.txt")
    assert release.TESTS_SHIPPED.fullmatch("tests/config.yml")
    for name in ("tests/unit/test_release.py", "tests/sanity/extra.txt", "tests/queues", "tests/integration/x.yml"):
        assert not release.TESTS_SHIPPED.fullmatch(name), name
