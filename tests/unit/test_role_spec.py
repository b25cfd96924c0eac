"""The role's argument specs and defaults describe the same variables."""

import pathlib
import re

import pytest
import yaml

ROLE = pathlib.Path(__file__).parents[2] / "roles" / "consumer"


def test_every_default_is_documented_with_its_value_and_nothing_more():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for entry_point in ("main", "preflight"):
        options = specs[entry_point]["options"]
        assert sorted(options) == sorted(defaults), entry_point
        assert {name: option["default"] for name, option in options.items()} == defaults, entry_point


def test_role_takes_the_shared_names_from_consumer_names():
    """The account, unit folder and secrets folder are written down once, in
    module_utils/consumer_names.py; the role's vars only point there."""
    from ansible_collections.batchq.consumers.plugins.filter.consumers import consumer_names
    from ansible_collections.batchq.consumers.plugins.module_utils import consumer_names as names

    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    resolved = {}
    for variable, expression in role_vars.items():
        match = re.fullmatch(r"\{\{ '(\w+)' \| batchq\.consumers\.consumer_names \}\}", expression)
        assert match, "%s is not taken from consumer_names: %r" % (variable, expression)
        resolved[variable] = consumer_names(match.group(1))
    assert resolved == {
        "_consumer_account": names.DEFAULT_ACCOUNT,
        "_consumer_unit_dir": names.UNIT_DIR,
        "_consumer_secrets_dir": names.SECRETS_DIR,
        "_consumer_drain_runner": names.DRAIN_RUNNER,
        "_consumer_continue_unit": names.CONTINUE_UNIT,
        "_consumer_after_run": names.AFTER_RUN,
        "_consumer_hooks_state_dir": names.HOOKS_STATE_DIR,
    }


def test_the_runner_writes_the_record_consumer_info_reads():
    """batchq-drain runs on the hosts on its own, so it spells the MESSAGE_ID out itself."""
    from ansible_collections.batchq.consumers.plugins.module_utils import consumer_names as names

    runner = (ROLE / "files" / "batchq-drain").read_text()
    assert 'BATCH_END = "%s"' % names.BATCH_END in runner


@pytest.mark.parametrize("folder, valid", [
    ("/var/lib/prometheus/node-exporter", True), ("/var/lib/node-exporter\n", False), ("/var/lib/x\ty", False),
    ("/var/lib/../x", False), ("var/lib", False),
])
def test_the_metrics_folder_check_takes_only_what_a_unit_line_can_hold(folder, valid):
    """consumer_metrics_dir goes into unit file lines as it is: a trailing newline must not pass."""
    import json

    import jinja2
    from ansible.plugins.test.core import TestModule

    environment = jinja2.Environment()
    environment.tests.update(TestModule().tests())
    environment.filters["to_json"] = json.dumps
    tasks = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
    check = next(task for task in tasks if task.get("name", "").startswith("Refuse the host, naming every consumer"))
    problems = environment.from_string(check["vars"]["_consumer_problems"]).render(
        consumer_metrics_dir=folder, _consumer_systemd={"refusal": ""}, _consumer_python={"problems": []},
        _consumer_units=[], _consumer_installed=[],
        _consumer_answers={"rejected_spans": [], "users": {}, "groups": {}, "missing_paths": []},
        inventory_hostname="host", _consumer_account="batchq")
    assert (problems == "") is valid, problems
    assert valid or problems.startswith("consumer_metrics_dir: must be an absolute path"), problems
