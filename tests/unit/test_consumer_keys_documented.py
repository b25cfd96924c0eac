"""Every key a consumer may carry is documented in the role's argument specs, with its default.

The role's reference (ansible-doc -t role, the docs site) lists the keys of a
consumer_list item in the description of consumer_list, one line each:
"C(key) (type, default C(value)) - meaning" ("required" or "default none" for
the keys without a default). The validation code (module_utils/consumer_spec.py,
ITEM_DEFAULTS) is what accepts keys and fills in defaults: the two must agree.
"""

import pathlib
import re

import yaml

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_spec import ITEM_DEFAULTS

SPECS = pathlib.Path(__file__).parents[2] / "roles" / "consumer" / "meta" / "argument_specs.yml"
ENTRY = re.compile(r"(C\(\w+\)(?:, C\(\w+\))*) \((.*?)\) - ", re.S)


def documented_keys():
    """{key: the text in parentheses after it} for every key line of consumer_list."""
    description = yaml.safe_load(SPECS.read_text())["argument_specs"]["main"]["options"]["consumer_list"]["description"]
    keys = {}
    for line in description:
        match = ENTRY.match(line)
        if match:
            for key in re.findall(r"C\((\w+)\)", match.group(1)):
                assert key not in keys, "%s is documented twice" % key
                keys[key] = " ".join(match.group(2).split())
    return keys


def test_every_accepted_key_is_documented_and_no_other():
    assert sorted(documented_keys()) == sorted(ITEM_DEFAULTS)


def test_every_documented_default_is_the_one_the_validation_fills_in():
    for key, text in documented_keys().items():
        value = ITEM_DEFAULTS[key]
        assert re.match(r"(str|int|bool|dict|list|path)\b", text), "%s: no type in %r" % (key, text)
        default = re.search(r"default C\((.*?)\)(?=[,;]|$)", text)
        if value is None:
            assert default is None and ("required" in text or "default none" in text), "%s: %r" % (key, text)
        elif isinstance(value, str):
            assert default and default.group(1) == value, "%s: %r, not %r" % (key, text, value)
        else:
            assert default and yaml.safe_load(default.group(1)) == value, "%s: %r, not %r" % (key, text, value)
