"""The role's argument specs and defaults describe the same variables."""

import pathlib

import yaml

ROLE = pathlib.Path(__file__).parents[2] / "roles" / "consumer"


def test_every_default_is_documented_with_its_value_and_nothing_more():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for entry_point in ("main", "preflight"):
        options = specs[entry_point]["options"]
        assert sorted(options) == sorted(defaults), entry_point
        assert {name: option["default"] for name, option in options.items()} == defaults, entry_point
