"""The role's argument specs and defaults describe the same variables."""

import json
import pathlib
import re
import subprocess

import yaml

ROLE = pathlib.Path(__file__).parents[2] / "roles" / "consumer"


def test_every_default_is_documented_with_its_value_and_nothing_more():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for entry_point in ("main", "preflight"):
        options = specs[entry_point]["options"]
        assert sorted(options) == sorted(defaults), entry_point
        assert {name: option["default"] for name, option in options.items()} == defaults, entry_point


def test_preflight_takes_the_variables_of_main_with_their_types():
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for name, option in specs["main"]["options"].items():
        preflight = specs["preflight"]["options"][name]
        assert (preflight["type"], preflight.get("elements")) == (option["type"], option.get("elements")), name


# Consumers that the role's own validation accepts, in forms that a typed
# nested spec would refuse or convert: a command as a string and as a list,
# time spans as numbers, a count as a string, a switch as "yes".
ODD_BUT_GOOD = [
    {"name": "as-string", "command": "/usr/bin/true --limit 100", "interval": 30, "timeout": 1.5},
    {"name": "as-list", "command": ["/usr/bin/true", "--limit", "100"], "start_delay": 0, "instances": "2",
     "hardening": "yes", "on_failure": ["/usr/bin/logger", "failed"], "on_failure_every": 600},
    {"name": "gone", "state": "absent"},
]


def test_ansible_core_passes_every_consumer_list_on_to_the_role(tmp_path):
    """ansible-core checks a role's arguments against its argument specs when an
    entry point starts, before the role's first task. It must neither refuse an
    item (the role's own validation names the consumer and the key) nor change
    one. A role with this role's argument specs, whose tasks only compare
    consumer_list with what the play gave, takes every bad list of
    test_bad_consumer_lists.py and the odd good one through both entry points."""
    import importlib.util

    from ansible_collections.batchq.consumers.plugins.filter.consumers import consumers

    spec = importlib.util.spec_from_file_location("bad_lists", pathlib.Path(__file__).parent / "test_bad_consumer_lists.py")
    bad_lists = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bad_lists)

    assert consumers(ODD_BUT_GOOD)
    lists = [ODD_BUT_GOOD] + [bad_lists.SCENARIO + (bad if isinstance(bad, list) else [bad])
                              for _case, bad, _words in bad_lists.CASES]
    probe = tmp_path / "roles" / "probe"
    (probe / "meta").mkdir(parents=True)
    (probe / "tasks").mkdir()
    (probe / "meta" / "argument_specs.yml").write_text((ROLE / "meta" / "argument_specs.yml").read_text())
    for entry_point in ("main", "preflight"):
        (probe / "tasks" / (entry_point + ".yml")).write_text(json.dumps([{
            "name": "The role gets the consumers as the play gave them",
            "ansible.builtin.assert": {"that": ["consumer_list | to_json == given | to_json"], "quiet": True}}]))
    plays = [{"hosts": "localhost", "gather_facts": False, "tasks": [{
        "name": "Start the role at %s" % entry_point,
        "ansible.builtin.include_role": {"name": "probe", "tasks_from": entry_point},
        "vars": {"consumer_list": "{{ item }}", "given": "{{ item }}"},
        "loop": lists,
    } for entry_point in ("main", "preflight")]}]
    (tmp_path / "play.yml").write_text(json.dumps(plays))
    result = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", "play.yml"],
                            cwd=tmp_path, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # For each list and entry point: ansible-core's check, then the role's task.
    assert result.stdout.count("TASK [probe : Validating arguments against arg spec") == 2 * len(lists), result.stdout
    assert result.stdout.count("TASK [probe : The role gets the consumers") == 2 * len(lists), result.stdout
    assert " failed=0 " in result.stdout, result.stdout


def test_role_takes_the_shared_names_from_consumer_names():
    """The account, unit folder and secrets folder are written down once, in
    module_utils/consumer_names.py; the role's vars only point there."""
    from ansible_collections.batchq.consumers.plugins.filter.consumers import consumer_names
    from ansible_collections.batchq.consumers.plugins.module_utils import consumer_names as names

    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    # the planner's settings, from these names and the role's defaults
    settings = role_vars.pop("_consumer_settings")
    assert sorted(settings) == ["account", "budget", "exclusive", "helper_dir", "hooks_state_dir", "metrics", "metrics_dir",
                                "prefix", "secrets_dir", "unit_dir"]
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
        "_consumer_slice_unit": names.SLICE_UNIT,
        "_consumer_slots": names.SLOTS,
        "_consumer_scale": names.SCALE,
        "_consumer_scale_unit": names.SCALE_UNIT,
    }
