"""Every module, filter and role entry point shows its own documentation.

ansible-doc and the docs site read the installed collection. A filter file
that holds several filters must not carry a DOCUMENTATION of its own: that one
hides the .yml file of every other filter beside it, and then all of them show
its text (and the site renders them as redirects to it). These tests run the
real ansible-doc and compare what it prints with each plugin's own source.
"""

import ast
import json
import pathlib
import subprocess

import pytest
import yaml

from ansible_collections.batchq.consumers.plugins.filter.consumers import FilterModule

ROOT = pathlib.Path(__file__).parents[2]
COLLECTION = "batchq.consumers"
# What users call, besides the role and the playbooks: the status playbook and the
# guides name these. Every other plugin is the role's and the playbooks' own.
PUBLIC = {("module", "consumer_info"), ("filter", "consumer_status_table"), ("filter", "consumer_status_problems")}
INTERNAL = "Internal: "


def python_documentation(path):
    """The DOCUMENTATION of a Python file, parsed; None when it has none."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "DOCUMENTATION" for target in node.targets):
            return yaml.safe_load(ast.literal_eval(node.value))
    return None


def filter_sources():
    """{filter name: its documentation, as written in its source}."""
    sources = {}
    for name in FilterModule().filters():
        sidecar = ROOT / "plugins" / "filter" / (name + ".yml")
        if sidecar.exists():
            sources[name] = yaml.safe_load(sidecar.read_text())["DOCUMENTATION"]
        else:
            sources[name] = python_documentation(ROOT / "plugins" / "filter" / (name + ".py"))
    return sources


def module_sources():
    return {path.stem: python_documentation(path) for path in sorted((ROOT / "plugins" / "modules").glob("*.py"))}


def role_sources():
    """{(role, entry point): its spec} of every role."""
    sources = {}
    for specs in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        role = specs.parents[1].name
        for entry_point, spec in yaml.safe_load(specs.read_text())["argument_specs"].items():
            sources[(role, entry_point)] = spec
    return sources


def ansible_doc(*args):
    result = subprocess.run(["ansible-doc", "--json", *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def fqcn(name):
    return "%s.%s" % (COLLECTION, name)


@pytest.mark.parametrize("plugin_type, sources, name_key", [
    ("filter", filter_sources, "name"),
    ("module", module_sources, "module"),
])
def test_each_plugin_page_is_its_own(plugin_type, sources, name_key):
    sources = sources()
    shown = ansible_doc("-t", plugin_type, *[fqcn(name) for name in sources])
    assert sorted(shown) == sorted(fqcn(name) for name in sources)
    for name, source in sources.items():
        assert source, "%s %s has no documentation in its source" % (plugin_type, name)
        assert source[name_key] == name, "%s: its source documents %s" % (name, source[name_key])
        doc = shown[fqcn(name)]["doc"]
        # A page named after another plugin is what the docs site renders as a redirect.
        assert doc[name_key] == name, "ansible-doc shows %s's page for %s %s" % (doc[name_key], plugin_type, name)
        assert doc["short_description"] == source["short_description"], name
        assert doc["description"] == source["description"], name


@pytest.mark.parametrize("plugin_type, sources", [("filter", filter_sources), ("module", module_sources)])
def test_the_list_gives_each_plugin_its_own_description(plugin_type, sources):
    listed = ansible_doc("-l", "-t", plugin_type, COLLECTION)
    assert listed == {fqcn(name): source["short_description"] for name, source in sources().items()}


def test_each_role_entry_point_shows_its_own_spec():
    sources = role_sources()
    for role in sorted({role for role, _entry_point in sources}):
        shown = ansible_doc("-t", "role", fqcn(role))[fqcn(role)]["entry_points"]
        assert sorted(shown) == sorted(entry for name, entry in sources if name == role)
        for entry_point, doc in shown.items():
            source = sources[(role, entry_point)]
            assert doc["short_description"] == source["short_description"], (role, entry_point)
            assert doc.get("options", {}).keys() == source.get("options", {}).keys(), (role, entry_point)


def test_no_two_pages_share_a_short_description():
    """The same words on two pages mean that one shows the other's documentation."""
    pages = {}
    for plugin_type, sources in (("filter", filter_sources()), ("module", module_sources())):
        listed = ansible_doc("-l", "-t", plugin_type, COLLECTION)
        for name in sources:
            pages["%s %s" % (plugin_type, name)] = listed[fqcn(name)]
    for role, _entry_point in role_sources():
        for entry_point, doc in ansible_doc("-t", "role", fqcn(role))[fqcn(role)]["entry_points"].items():
            pages["role %s, entry point %s" % (role, entry_point)] = doc["short_description"]
    seen = {}
    for page, description in sorted(pages.items()):
        assert description not in seen, "%s and %s both say %r" % (seen.get(description), page, description)
        seen[description] = page


@pytest.mark.parametrize("plugin_type, sources", [("filter", filter_sources), ("module", module_sources)])
def test_only_the_public_plugins_are_public(plugin_type, sources):
    """An internal plugin says so first thing, and has no version: the docs site lists it apart
    (tools/docs/conf.py) and the changelog leaves it out (it lists plugins by version_added)."""
    for name, source in sources().items():
        if (plugin_type, name) in PUBLIC:
            assert not source["short_description"].startswith(INTERNAL), name
            assert str(source.get("version_added")) == "0.1.0", name
        else:
            assert source["short_description"].startswith(INTERNAL), "%s %s is neither public nor marked internal" % (plugin_type, name)
            assert source["description"][0].startswith("Internal. "), name
            assert "version_added" not in source, name


def test_every_public_plugin_exists():
    names = {("filter", name) for name in filter_sources()} | {("module", name) for name in module_sources()}
    assert PUBLIC <= names
