"""The unit files and runtime specs of every molecule scenario's consumers, on
the answers of real Debian 11, 12, 13 and testing hosts, rendered as the role
renders them, without a host.

The role renders the units with one template lookup (consumer.units.j2) from
the plan. Here the same templates are rendered with Jinja2 and ansible-core's
own filters, from the plan of the same consumers on each recorded host
(tests/unit/fixtures/<suite>/preflight.json). Molecule proves what needs
systemd; this proves, for every consumer of every scenario on every release,
that the units and the specs the host-side programs read agree.
"""

import configparser
import json
import pathlib
import re

import jinja2
import pytest
import yaml

from ansible.plugins.filter.core import FilterModule
from ansible_collections.batchq.consumers.plugins.filter.consumers import consumers as normalized
from ansible_collections.batchq.consumers.plugins.module_utils import consumer_names
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_plan import plan, questions, with_texts, wanted_files

ROOT = pathlib.Path(__file__).parents[2]
FIXTURES = pathlib.Path(__file__).parent / "fixtures"
SUITES = {"bullseye": "debian11", "bookworm": "debian12", "trixie": "debian13", "forky": "debiantesting"}
SCENARIOS = ["capacity", "compat", "default", "drain", "faults", "fleet", "info"]
METRICS_DIR = "/var/lib/prometheus/node-exporter"
HELPER_DIR = consumer_names.DRAIN_RUNNER.rsplit("/", 1)[0]
# a form of the role's vars/main.yml and defaults/main.yml, as the role resolves them
SETTINGS = {"account": consumer_names.DEFAULT_ACCOUNT, "prefix": "batchq-", "exclusive": False, "metrics": True,
            "metrics_dir": METRICS_DIR, "helper_dir": HELPER_DIR, "unit_dir": consumer_names.UNIT_DIR,
            "secrets_dir": consumer_names.SECRETS_DIR, "hooks_state_dir": consumer_names.HOOKS_STATE_DIR}


def group_vars(scenario, suite):
    """The scenario's consumers group's variables, their Jinja resolved as for that suite's host."""
    variables = yaml.safe_load((ROOT / "molecule" / scenario / "group_vars" / "consumers.yml").read_text())
    context = dict(variables, inventory_hostname="batchq-%s-%s" % (scenario, SUITES[suite]),
                   groups={"queue_db": ["batchq-fleet-db"]}, pgqueue_password="secret")
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined)
    environment.filters.update(FilterModule().filters())
    environment.tests["search"] = lambda value, pattern: re.search(pattern, value) is not None

    def resolve(value):
        if isinstance(value, str) and "{{" in value:
            rendered = environment.from_string(value).render(context)
            return yaml.safe_load(rendered) if rendered.startswith(("{", "[")) else rendered
        if isinstance(value, list):
            return [resolve(item) for item in value]
        if isinstance(value, dict):
            return {key: resolve(item) for key, item in value.items()}
        return value
    context["pgqueue_pooler"] = resolve(variables.get("pgqueue_pooler", False)) == "True"
    return resolve(variables["consumer_list"]), resolve(variables.get("consumer_defaults", {}))


def host_answers(suite, units):
    """The recorded host's answers, with a #! line of python3 for each preloaded script asked about."""
    answers = json.loads((FIXTURES / suite / "preflight.json").read_text())
    answers["first_lines"] = dict(answers["first_lines"], **{
        script: "#!/usr/bin/python3" for script in questions(units, "batchq", SETTINGS)["first_lines"]})
    return answers


def render(decided):
    """The unit files of a plan, as preflight.yml renders them: {name: text}."""
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROOT / "roles" / "consumer" / "templates")),
                                     undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    environment.filters.update(FilterModule().filters())
    text = environment.get_template("consumer.units.j2").render(
        ansible_managed="Ansible managed", consumer_metrics_dir=METRICS_DIR,
        _consumer_installed=decided["installed"], _consumer_systemd=decided["systemd"],
        _consumer_pythons=decided["pythons"], _consumer_metrics=decided["settings"]["metrics"],
        _consumer_runtime=decided["runtime"], _consumer_drain_runner=consumer_names.DRAIN_RUNNER,
        _consumer_after_run=consumer_names.AFTER_RUN, _consumer_continue_unit=consumer_names.CONTINUE_UNIT,
        _consumer_budget=decided["budget"], _consumer_slice=decided["slice"],
        _consumer_slice_unit=consumer_names.SLICE_UNIT, _consumer_slots=consumer_names.SLOTS,
        _consumer_scale=consumer_names.SCALE, _consumer_scale_unit=consumer_names.SCALE_UNIT,
        consumer_unit_prefix=SETTINGS["prefix"])
    return json.loads(text)


def settings_of(text):
    """A unit file's settings: {(section, key): [values]}, comments and blank lines left out."""
    found, section = {}, None
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, value = line.split("=", 1)
        found.setdefault((section, key), []).append(value)
    return found


CASES = [(scenario, suite) for scenario in SCENARIOS for suite in SUITES]


@pytest.mark.parametrize("scenario, suite", CASES)
def test_each_consumers_units_pass_its_programs_the_spec_the_role_lays_out(scenario, suite):
    consumer_list, defaults = group_vars(scenario, suite)
    units = normalized(consumer_list, defaults)
    decided = plan(units, host_answers(suite, units), SETTINGS, suite)
    files = render(decided)
    laid_out = {entry["path"]: entry for entry in with_texts(wanted_files(units, SETTINGS,
                                                                          decided["systemd"]["features"]
                                                                          ["credentials_encrypted"]), str)}
    assert decided["installed"], "the scenario deploys no consumer"
    for unit in decided["installed"]:
        service = settings_of(files[unit["service_unit"]])
        assert unit["timer_unit"] in files
        runtime = decided["runtime"].get(unit["name"])
        exec_start = " ".join(service[("Service", "ExecStart")])
        stop_post = service.get(("Service", "ExecStopPost"), [])
        if runtime:
            # the spec the units name is the one laid out, as the programs read it
            assert json.loads(laid_out[runtime["path"]]["content"]) == runtime["spec"]
        if unit["backlog_exit_code"]:
            assert re.search(r" --spec %s --unit %%n -- " % re.escape(runtime["path"]), exec_start), exec_start
            assert service[("Service", "SuccessExitStatus")] == [str(unit["backlog_exit_code"])]
            assert (("Unit", "OnSuccess") in service) == decided["systemd"]["features"]["drain_continue"]
        else:
            assert "--spec" not in exec_start
        wanted = []
        if runtime and runtime["after_run"]:
            wanted.append("-+/usr/bin/python3 -I %s --spec %s --unit %%n" % (consumer_names.AFTER_RUN, runtime["path"]))
        if unit["scale"]:
            wanted.append("-+/usr/bin/python3 -I %s --spec %s --unit %%n settle" % (consumer_names.SCALE, runtime["path"]))
        assert stop_post == wanted
        # no budget: the slice holds every unit, and nothing waits for a slot
        assert service[("Service", "Slice")] == [consumer_names.SLICE_UNIT]
        assert not any(consumer_names.SLOTS in line for line in service.get(("Service", "ExecStartPre"), []))
    assert settings_of(files[consumer_names.SLICE_UNIT]) == {("Unit", "Description"): ["batchq consumers of this host"]}


@pytest.mark.parametrize("suite", SUITES)
def test_the_running_cap_is_the_slices_from_258_on_and_each_units_own_before(suite):
    consumer_list, defaults = group_vars("compat", suite)  # a drain and plain consumers
    units = normalized(consumer_list, defaults)
    budget = {"cpu_quota": "150%", "memory_max": "2G", "tasks_max": 512, "running_max": 2}
    decided = plan(units, host_answers(suite, units), dict(SETTINGS, budget=budget), suite)
    files = render(decided)
    queued = decided["systemd"]["version"] >= 258
    assert decided["systemd"]["features"]["slice_concurrency"] == queued
    wanted_slice = {("Unit", "Description"): ["batchq consumers of this host"], ("Slice", "CPUQuota"): ["150%"],
                    ("Slice", "MemoryMax"): ["2G"], ("Slice", "TasksMax"): ["512"]}
    if queued:
        wanted_slice[("Slice", "ConcurrencySoftMax")] = ["2"]
    assert settings_of(files[consumer_names.SLICE_UNIT]) == wanted_slice
    assert any(unit["backlog_exit_code"] for unit in decided["installed"])
    assert any(not unit["backlog_exit_code"] for unit in decided["installed"])
    for unit in decided["installed"]:
        service = settings_of(files[unit["service_unit"]])
        runtime = decided["runtime"][unit["name"]]
        assert runtime["spec"]["running_max"] == 2
        slots = "/usr/bin/python3 -I %s --spec %s --unit %%n" % (consumer_names.SLOTS, runtime["path"])
        assert service[("Service", "Slice")] == [consumer_names.SLICE_UNIT]
        if queued:
            # systemd holds the start back; the unit only measures the wait
            assert service[("Service", "ExecStartPre")][-1] == "+" + slots + " waited"
            assert not any(consumer_names.SLOTS in line for line in service.get(("Service", "ExecStopPost"), []))
        else:
            # the last step before the batch takes a slot; the first after it gives the slot back
            assert service[("Service", "ExecStartPre")][-1] == "+" + slots + " take"
            assert service[("Service", "ExecStopPost")][0] == "-+" + slots + " give"
            # the helper's StatusText reaches systemd
            assert service[("Service", "NotifyAccess")] == ["exec"]
            # no start timeout, which would count the wait: the runner times each batch out from its own start
            assert service[("Service", "TimeoutStartSec")] == ["infinity"]
            assert " --spec %s --unit %%n -- " % runtime["path"] in service[("Service", "ExecStart")][0]
            assert runtime["spec"]["runner"] and not runtime["after_run"]


@pytest.mark.parametrize("suite", SUITES)
def test_a_range_of_instances_gets_a_path_unit_that_starts_the_scaler_and_each_run_settles(suite):
    consumer_list, defaults = group_vars("capacity", suite)
    units = normalized(consumer_list, defaults)
    decided = plan(units, host_answers(suite, units), SETTINGS, suite)
    files = render(decided)
    (unit,) = [unit for unit in decided["installed"] if unit["scale"]]
    spec = decided["runtime"][unit["name"]]["spec"]
    stem = "batchq-" + unit["name"]
    assert spec["scale"] == {"min": 1, "max": 4, "cooldown_usec": 10_000_000,
                             "request": "/var/lib/batchq/%s/scale-request" % unit["name"],
                             "status": "/run/batchq/scale/%s.json" % stem,
                             "metrics_file": "%s/%s.scale.prom" % (METRICS_DIR, stem)}
    assert settings_of(files[stem + ".path"]) == {
        ("Unit", "Description"): ["Scale-up requests of batchq consumer %s" % unit["name"]],
        ("Path", "PathChanged"): [spec["scale"]["request"]], ("Path", "Unit"): ["batchq.scale@%s.service" % stem],
        ("Install", "WantedBy"): ["paths.target"]}
    scaler = settings_of(files[consumer_names.SCALE_UNIT])
    # %i is the stem: the spec's name
    assert scaler[("Service", "ExecStart")] == ["/usr/bin/python3 -I %s --spec %s/specs/%%i.json wake"
                                                % (consumer_names.SCALE, HELPER_DIR)]
    assert decided["runtime"][unit["name"]]["path"] == "%s/specs/%s.json" % (HELPER_DIR, stem)
    assert scaler[("Unit", "StartLimitIntervalSec")] == ["0"]
    timer = settings_of(files[unit["timer_unit"]])
    assert (timer[("X-Batchq", "Instances")], timer[("X-Batchq", "MinInstances")]) == (["4"], ["1"])
    # a deploy starts instance 1 and the path unit, and leaves instances 2 to 4 to the backlog, never enabled
    assert [entry["timer"] for entry in decided["start"] if entry["timer"].startswith(stem)] == (
        [] if unit["state"] == "paused" else [stem + "@1.timer"]) + [stem + ".path"]
    assert decided["disable"] == ([] if unit["state"] == "paused" else [stem + "@%d.timer" % n for n in (2, 3, 4)])


@pytest.mark.parametrize("scenario, suite", CASES)
def test_no_unit_holds_a_value_the_template_left_unset(scenario, suite):
    consumer_list, defaults = group_vars(scenario, suite)
    units = normalized(consumer_list, defaults)
    files = render(plan(units, host_answers(suite, units), SETTINGS, suite))
    for name, text in files.items():
        assert "{{" not in text and "{%" not in text, name
        for (section, key), values in settings_of(text).items():
            assert section in ("Unit", "Service", "Timer", "Path", "Install", "X-Batchq", "Slice"), (name, section)
            assert all(value.strip() not in ("", "None") for value in values if key != "CapabilityBoundingSet"
                       and key != "AmbientCapabilities"), (name, key, values)
    # systemd reads what configparser reads (one key per line, no continuation here)
    for text in files.values():
        configparser.ConfigParser(strict=False, interpolation=None).read_string(
            "\n".join(line for line in text.splitlines() if not line.startswith("#")))
