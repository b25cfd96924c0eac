"""What the READMEs (the collection's and the role's), CONTRIBUTING.md and the guides show works as shown.

Checked without hosts: every consumer_list in their YAML examples passes the
collection's own validation, every `make TARGET` is a target of the Makefile,
every playbook named by `ansible-playbook batchq.consumers.NAME` is shipped,
and every file or folder of this tree that they name exists.
"""

import glob
import pathlib
import re

import pytest
import yaml

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_spec import normalize_consumers

ROOT = pathlib.Path(__file__).parents[2]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "roles" / "consumer" / "README.md"] + sorted((ROOT / "docs" / "docsite" / "rst").glob("*.rst"))
TOP_FOLDERS = ("benchmarks", "changelogs", "demo", "docs", "examples", "molecule", "playbooks", "plugins",
               "requirements", "roles", "tests", "tools")


def yaml_blocks(path):
    """The YAML code blocks of a markdown or reStructuredText file."""
    text = path.read_text()
    if path.suffix == ".md":
        return re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S)
    blocks = []
    for match in re.finditer(r"^\.\. code(?:-block)?:: yaml\n\n((?:(?:   .*)?\n)+)", text, re.M):
        blocks.append("\n".join(line[3:] for line in match.group(1).split("\n")))
    return blocks


def consumer_lists(node):
    """Every (consumer_list, consumer_defaults) pair anywhere in a loaded YAML document."""
    if isinstance(node, dict):
        if "consumer_list" in node:
            yield node["consumer_list"], node.get("consumer_defaults", {})
        for value in node.values():
            yield from consumer_lists(value)
    elif isinstance(node, list):
        for value in node:
            yield from consumer_lists(value)


def examples():
    for path in DOCS:
        for number, block in enumerate(yaml_blocks(path)):
            for consumers, defaults in consumer_lists(yaml.safe_load(block)):
                yield pytest.param(consumers, defaults, id="%s-%d" % (path.relative_to(ROOT), number))


def literals():
    """Every inline literal of the documents: `x` in markdown, ``x`` in rst, and code lines."""
    for path in DOCS:
        text = path.read_text()
        pattern = r"``(.+?)``" if path.suffix == ".rst" else r"`([^`\n]+)`"
        for literal in re.findall(pattern, text, re.S):
            yield path.name, " ".join(literal.split())
        for block in re.findall(r"^```(?:sh|text)?\n(.*?)^```", text, re.M | re.S) if path.suffix == ".md" else \
                re.findall(r"^\.\. code(?:-block)?:: sh\n\n((?:(?:   .*)?\n)+)", text, re.M):
            for line in block.split("\n"):
                yield path.name, line.strip()


@pytest.mark.parametrize("consumers, defaults", list(examples()))
def test_every_consumer_list_shown_passes_validation(consumers, defaults):
    assert normalize_consumers(consumers, defaults)


def test_the_documents_show_consumer_lists():
    assert len(list(examples())) >= 5


def test_every_make_target_named_exists():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = {}
    for name, literal in literals():
        for words in re.findall(r"(?:^|&& |; )make ((?:[a-z][a-z-]* ?)+)", literal):
            for word in words.split():
                named.setdefault(word, name)
    assert named, "no make target named"
    missing = {word: name for word, name in named.items() if word not in targets}
    assert not missing


def test_every_playbook_named_is_shipped():
    named = {match for unused, literal in literals()
             for match in re.findall(r"batchq\.consumers\.(\w+)", literal)
             if re.search(r"ansible-playbook (?:-i \S+ )?batchq\.consumers\." + match, literal)}
    assert {"deploy_consumers", "consumer_status", "consumer_control"} <= named
    for playbook in named:
        assert (ROOT / "playbooks" / (playbook + ".yml")).is_file(), playbook


def test_every_file_of_the_tree_named_exists():
    missing = []
    for name, literal in literals():
        for word in literal.split():
            word = word.strip("(),;:")
            if word.split("/")[0] in TOP_FOLDERS and "/" in word and "<" not in word and "$" not in word:
                if not glob.glob(str(ROOT / word.split(":")[0])):
                    missing.append((name, word))
    assert not missing
