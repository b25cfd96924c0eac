"""Every key a consumer may carry is documented in the role's argument specs, with its default.

The role's reference (ansible-doc -t role, the docs site) lists the keys of a
consumer_list item as the nested options of consumer_list, one row each. The
validation code (module_utils/consumer_spec.py, ITEM_DEFAULTS) is what accepts
keys and fills in defaults: the two must agree.
"""

import pathlib

import yaml

from ansible_collections.batchq.consumers.plugins.filter.consumers import consumers
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_spec import HOOK_KEYS, ITEM_DEFAULTS, TIME_KEYS

SPECS = pathlib.Path(__file__).parents[2] / "roles" / "consumer" / "meta" / "argument_specs.yml"
TYPES = {"str", "int", "bool", "dict", "list", "path", "raw"}
# Keys that take values of more than one type: a string or a number of
# seconds, a command line or a list of words, a number or "infinity", a
# number or a range of instances.
RAW_KEYS = set(TIME_KEYS) | set(HOOK_KEYS) | {"command", "tasks_max", "instances"}


def main_spec():
    return yaml.safe_load(SPECS.read_text())["argument_specs"]["main"]


def documented_keys():
    return main_spec()["options"]["consumer_list"]["options"]


def test_every_accepted_key_is_documented_and_no_other():
    assert sorted(documented_keys()) == sorted(ITEM_DEFAULTS)


def test_every_documented_default_is_the_one_the_validation_fills_in():
    for key, option in documented_keys().items():
        assert option["type"] in TYPES, key
        assert option["description"], key
        if ITEM_DEFAULTS[key] is None:
            assert "default" not in option, key
        else:
            assert option["default"] == ITEM_DEFAULTS[key], key


def test_keys_of_several_types_are_documented_as_raw():
    for key, option in documented_keys().items():
        assert (option["type"] == "raw") == (key in RAW_KEYS), key


def test_ansible_core_is_not_asked_to_check_the_items():
    """With "elements: dict", ansible-core checks every item against the nested
    options when the role starts: it refuses an unknown key before the role's
    own validation can name the consumer (test_role_spec.py runs it)."""
    consumer_list = main_spec()["options"]["consumer_list"]
    assert (consumer_list["type"], consumer_list["elements"]) == ("list", "raw")


def test_the_examples_deploy():
    for play in yaml.safe_load(main_spec()["examples"]):
        for role in play["roles"]:
            variables = role["vars"]
            assert consumers(variables["consumer_list"], variables.get("consumer_defaults"))
