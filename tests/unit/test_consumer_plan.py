"""The role's decisions (module_utils/consumer_plan.py), each from what the
user gave and what a real host answered: the consumer_preflight module's
answers recorded on fresh Debian 11, 12, 13 and testing hosts
(tests/unit/fixtures/SUITE/preflight.json, by fixtures/record-preflight.sh),
changed where a test needs another host."""

import copy
import grp
import json
import os
import pathlib
import pwd

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_layout import describe
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_plan import (
    AFTER_RUN_HELPERS,
    DRAIN_HELPERS,
    HELPERS,
    SHARED_HELPERS,
    SLOT_HELPERS,
    digest,
    files_to_lay_out,
    plan,
    questions,
    units_to_write,
    wanted_files,
    with_texts,
)
from ansible_collections.batchq.consumers.plugins.filter.consumers import consumer_plan as consumer_plan_filter
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_spec import normalize_consumers
from ansible_collections.batchq.consumers.plugins.modules import consumer_files, consumer_preflight

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
SUITES = ("bullseye", "bookworm", "trixie", "forky")
SETTINGS = {"account": "batchq", "prefix": "batchq-", "exclusive": False, "metrics": True,
            "metrics_dir": "/var/lib/prometheus/node-exporter", "helper_dir": "/usr/local/lib/batchq",
            "unit_dir": "/etc/systemd/system", "secrets_dir": "/etc/batchq", "hooks_state_dir": "/var/lib/batchq-hooks"}
UNIT_DIR, SECRETS_DIR = "/etc/systemd/system", "/etc/batchq"
PLAIN = {"name": "thumbs", "command": "/usr/bin/python3 -c pass"}


def recorded(suite):
    return json.loads((FIXTURES / suite / "preflight.json").read_text())


def answers(suite="bookworm", **changes):
    found = copy.deepcopy(recorded(suite))
    found.update(changes)
    return found


def units(*consumers, defaults=None):
    return normalize_consumers([dict(c) for c in consumers], defaults or {}, "batchq-")


def planned(*consumers, suite="bookworm", settings=None, host="h1", **host_changes):
    return plan(units(*consumers), answers(suite, **host_changes), dict(SETTINGS, **(settings or {})), host)


def wanted(*consumers, settings=None):
    """The files and folders the consumers need laid out, whatever the host has."""
    return wanted_files(units(*consumers), dict(SETTINGS, **(settings or {})))


# What the recordings are: fresh hosts, without the role's account.
@pytest.mark.parametrize("suite", SUITES)
def test_the_recorded_hosts_are_fresh_and_found_the_wrong_answers(suite):
    found = recorded(suite)
    assert "batchq" not in found["users"] and "ghost" not in found["users"] and "root" in found["users"]
    assert found["rejected_spans"] == ["1 fortnight"]
    assert found["missing_paths"] == ["/srv/missing"]
    assert found["units"] == {}
    assert found["first_lines"]["/usr/bin/pydoc3"].startswith("#!") and "python3" in found["first_lines"]["/usr/bin/pydoc3"]
    assert found["stale_units"] == []
    assert found["unit_states"]["systemd-tmpfiles-clean.timer"]["ActiveState"] == "active"
    assert found["unit_states"]["batchq-thumbs.timer"] == {"UnitFileState": "", "ActiveState": "inactive"}
    assert [found["stat"][path] and found["stat"][path]["type"] for path in (
        "/var/lib/prometheus/node-exporter", "/usr/local/lib/batchq", "/etc/passwd", "/etc/mtab", "/dev/null")] == [
        "directory", None, "file", "link", "other"]


# Questions
def test_questions_name_every_span_account_path_and_preloaded_script_once():
    asked = questions(units(
        dict(PLAIN, user="app", group="app", writable_paths=["/srv/a"]),
        {"name": "other", "command": "/usr/local/bin/job", "user": "app", "timeout": "1h"},
        {"name": "gone", "command": "/usr/local/bin/gone", "user": "old", "state": "absent"},
        {"name": "fast", "command": "/usr/local/bin/script.py", "preload": ["json"], "backlog_exit_code": 75}),
        "batchq")
    assert asked["users"] == ["batchq", "app"]  # the account first; not a removed consumer's user
    assert asked["groups"] == ["batchq", "app"]
    assert asked["paths"] == ["/usr/bin/python3", "/srv/a", "/usr/local/bin/job", "/usr/local/bin/script.py"]
    assert asked["first_lines"] == ["/usr/local/bin/script.py"]
    assert "1h" in asked["spans"] and len(asked["spans"]) == len(set(asked["spans"]))
    assert "unit_states" not in asked and "stat" not in asked  # only with the plan's settings


def test_questions_with_the_settings_ask_for_each_timer_with_its_start_and_each_file_of_the_plan():
    consumers = units(dict(PLAIN, instances=2), dict(PLAIN, name="held", state="paused"),
                      dict(PLAIN, name="gone", state="absent"))
    asked = questions(consumers, "batchq", SETTINGS)
    assert asked["unit_states"] == [
        "batchq-thumbs@1.timer", "batchq-thumbs.1.start.timer", "batchq-thumbs.1.start.service",
        "batchq-thumbs@2.timer", "batchq-thumbs.2.start.timer", "batchq-thumbs.2.start.service",
        "batchq-held.timer", "batchq-held.start.timer", "batchq-held.start.service"]
    assert asked["stat"] == [entry["path"] for entry in wanted_files(consumers, SETTINGS)]
    assert "/var/lib/prometheus/node-exporter/batchq-held.paused.prom" in asked["stat"]


# Problems: each names the consumer and the field, or the setting
@pytest.mark.parametrize("suite", SUITES)
def test_a_plain_consumer_on_each_fresh_host_has_no_problem(suite):
    assert planned(PLAIN, suite=suite)["problems"] == []


@pytest.mark.parametrize("consumer, host_changes, expected", [
    # the controller accepts every span it parses; an older systemd may know fewer units
    (dict(PLAIN, timeout="3 weeks"), {"rejected_spans": ["3 weeks"]},
     "systemd-analyze on h1 rejects consumer 'thumbs': field 'timeout': '3 weeks' is not a systemd time span;"),
    (dict(PLAIN, user="ghost"), {}, "consumer 'thumbs': field 'user': no passwd entry ghost on h1;"),
    (dict(PLAIN, group="ghosts"), {}, "consumer 'thumbs': field 'group': no group entry ghosts on h1;"),
    (dict(PLAIN, working_directory="/srv/missing"), {},
     "consumer 'thumbs': field 'working_directory': /srv/missing does not exist on h1;"),
    (dict(PLAIN, command="/srv/missing --limit 10"), {}, "consumer 'thumbs': field 'command': /srv/missing does not exist on h1;"),
    # a drain's ExecStart= names the runner: systemd-analyze verify never sees its command
    (dict(PLAIN, command="/srv/missing", backlog_exit_code=75), {},
     "consumer 'thumbs': field 'command': /srv/missing does not exist on h1;"),
    (dict(PLAIN, environment_file="/srv/missing"), {},
     "consumer 'thumbs': field 'environment_file': /srv/missing does not exist on h1;"),
    (dict(PLAIN, on_failure="/srv/missing --now"), {}, "consumer 'thumbs': field 'on_failure': /srv/missing does not exist on h1;"),
])
def test_a_problem_of_one_consumer_names_it_and_its_field(consumer, host_changes, expected):
    assert planned(consumer, **host_changes)["problems"] == [expected]


def test_the_role_account_needs_no_entry_yet_it_is_made():
    assert planned(dict(PLAIN, user="batchq", group="batchq"))["problems"] == []


def test_a_removed_consumer_needs_neither_its_account_nor_its_command_on_the_host():
    gone = dict(PLAIN, user="ghost", command="/srv/missing", state="absent")
    assert planned(gone)["problems"] == []


def test_every_problem_of_every_consumer_is_named_at_once():
    found = planned(dict(PLAIN, user="ghost"), {"name": "b", "command": "/srv/missing", "interval": "3 weeks"},
                    rejected_spans=["3 weeks"])
    assert len(found["problems"]) == 3, found["problems"]


# consumer_metrics_dir goes into unit file lines as it is: a trailing newline or a tab must not pass
@pytest.mark.parametrize("folder", ["relative/dir", "/var/lib/../etc", "/var/lib/node exporter", "/dir/\n", "/a/./b",
                                    "/var/lib/x\ty"])
def test_a_metrics_folder_systemd_would_read_otherwise_is_refused(folder):
    found = planned(PLAIN, settings={"metrics_dir": folder})["problems"]
    assert len(found) == 1 and found[0].startswith("consumer_metrics_dir: must be an absolute path") \
        and json.dumps(folder) in found[0]


def test_a_metrics_folder_of_the_allowed_letters_is_taken():
    assert planned(PLAIN, settings={"metrics_dir": "/var/lib/prometheus/node_exporter-2.d"})["problems"] == []


def test_a_host_with_an_older_systemd_is_refused_naming_both_versions():
    found = planned(PLAIN, systemctl_version="systemd 245 (245.4-4ubuntu3.24)\n+PAM")["problems"]
    assert found == ["h1 has systemd 245; the batchq.consumers.consumer role needs systemd 247 or later"]


def test_a_preloaded_script_that_is_not_python_is_refused():
    script = {"name": "fast", "command": "/usr/bin/ldd --version", "preload": ["json"], "backlog_exit_code": 75}
    found = planned(script)["problems"]
    assert len(found) == 1 and found[0].startswith("consumer 'fast': field 'command':"), found


def test_a_preloaded_python_script_runs_under_its_own_python():
    script = {"name": "fast", "command": "/usr/bin/pydoc3 json", "preload": ["json"], "backlog_exit_code": 75}
    decided = planned(script)
    assert decided["problems"] == [] and "python3" in decided["pythons"]["fast"]


# Credentials where systemd cannot pass them on (a private /run, as in a container)
@pytest.mark.parametrize("suite, refused", [("bullseye", True), ("bookworm", True), ("trixie", True), ("forky", False)])
def test_credentials_on_a_private_run_are_refused_below_systemd_262(suite, refused):
    keeper = dict(PLAIN, credentials={"token": "s3cret"})
    found = planned(keeper, suite=suite, credentials_shared=False)["problems"]
    if refused:
        assert len(found) == 1 and found[0].startswith(
            "consumer 'thumbs': field 'credentials': /run is a private mount on h1"), found
        assert "mount --make-shared /run" in found[0]
    else:
        assert found == []


def test_credentials_on_a_shared_run_are_fine_on_every_systemd():
    keeper = dict(PLAIN, credentials={"token": "s3cret"})
    for suite in SUITES:
        assert planned(keeper, suite=suite, credentials_shared=True)["problems"] == []


# systemd 247 fails every command before the main one of a sandboxed unit with credentials (226/NAMESPACE)
@pytest.mark.parametrize("extra, settings, why", [
    ({"secret_environment": {"API": "x"}}, None, "the check of its environment files"),
    ({"environment_file": "/etc/hostname"}, None, "the check of its environment files"),
    ({}, {"budget": {"running_max": 2}}, "the wait for a slot of consumer_budget.running_max"),
    ({"service_options": {"ExecStartPre": "/bin/true"}}, None, "its own ExecStartPre= or ExecCondition="),
])
def test_credentials_with_a_command_before_the_batch_are_refused_on_systemd_247(extra, settings, why):
    keeper = dict(PLAIN, credentials={"token": "s3cret"}, **extra)
    found = planned(keeper, suite="bullseye", settings=settings, credentials_shared=True)["problems"]
    assert len(found) == 1 and found[0].startswith(
        "consumer 'thumbs': field 'credentials': systemd 247 on h1 cannot start a unit with credentials"), found
    assert why in found[0] and "secret_environment" in found[0]
    for suite in ("bookworm", "trixie", "forky"):
        assert planned(keeper, suite=suite, settings=settings, credentials_shared=True)["problems"] == [], suite
    # either alone is fine on 247
    assert planned(dict(PLAIN, **extra), suite="bullseye", settings=settings)["problems"] == []
    assert planned(dict(PLAIN, credentials={"token": "s3cret"}), suite="bullseye", credentials_shared=True)["problems"] == []


# The account
def test_a_fresh_host_gets_the_account_when_a_consumer_runs_as_it():
    assert planned(PLAIN)["account"] == {"ready": False, "make_group": True, "make_user": True}


def test_a_consumer_of_another_user_in_the_account_group_gets_the_group_alone():
    assert planned(dict(PLAIN, user="nobody"))["account"] == {"ready": False, "make_group": True, "make_user": False}


def test_no_account_is_made_when_no_consumer_uses_it():
    assert planned(dict(PLAIN, user="nobody", group="nogroup"))["account"]["make_group"] is False


def test_an_account_already_as_the_role_makes_it_is_left_alone():
    ready = answers(users={"batchq": {"uid": 998, "gid": 998, "home": "/var/lib/batchq", "shell": "/usr/sbin/nologin"}},
                    groups={"batchq": 998})
    decided = plan(units(PLAIN), ready, SETTINGS, "h1")
    assert decided["account"] == {"ready": True, "make_group": False, "make_user": False}


def test_an_account_with_another_shell_is_made_again():
    other = answers(users={"batchq": {"uid": 998, "gid": 998, "home": "/var/lib/batchq", "shell": "/bin/bash"}},
                    groups={"batchq": 998})
    assert plan(units(PLAIN), other, SETTINGS, "h1")["account"]["make_user"] is True


# Timers: started, stopped, started after the old shape's batch
def test_a_present_consumer_starts_each_timer_start_delay_later():
    decided = planned(dict(PLAIN, instances=2, start_delay="30s", accuracy="2s", jitter="5s"))
    assert decided["start"] == [
        {"timer": "batchq-thumbs@1.timer", "delay": "30s", "accuracy": "2s", "jitter": "5s"},
        {"timer": "batchq-thumbs@2.timer", "delay": "30s", "accuracy": "2s", "jitter": "5s"}]
    assert decided["stop"] == [] and decided["start_after_removal"] == []


def test_a_paused_consumer_is_stopped_and_not_started():
    decided = planned(dict(PLAIN, state="paused"))
    assert decided["start"] == [] and decided["stop"] == ["batchq-thumbs.timer"]


def test_a_removed_consumer_is_neither_started_nor_stopped_here():
    decided = planned(dict(PLAIN, state="absent"))
    assert (decided["start"], decided["stop"], decided["installed"]) == ([], [], [])


@pytest.mark.parametrize("instances, host_has", [(2, "batchq-thumbs.service"), (1, "batchq-thumbs@.service")])
def test_a_consumer_that_changes_shape_starts_only_after_the_old_shape_is_removed(instances, host_has):
    decided = planned(dict(PLAIN, instances=instances), units={host_has: "0" * 64})
    assert decided["reshaped"] == ["thumbs"] and decided["start"] == []
    assert [entry["timer"] for entry in decided["start_after_removal"]] == (
        ["batchq-thumbs@1.timer", "batchq-thumbs@2.timer"] if instances == 2 else ["batchq-thumbs.timer"])


def test_a_consumer_of_the_same_shape_starts_at_once():
    decided = planned(PLAIN, units={"batchq-thumbs.service": "0" * 64})
    assert decided["reshaped"] == [] and [e["timer"] for e in decided["start"]] == ["batchq-thumbs.timer"]


# Timers already as wanted are left alone: a deploy that changes nothing skips consumer_units
def states(timer="batchq-thumbs.timer", file_state="enabled", active="active", starter="inactive"):
    """consumer_preflight's unit_states of a timer and its scheduled start."""
    stem = timer[:-len(".timer")]
    return {"unit_states": {timer: {"UnitFileState": file_state, "ActiveState": active},
                            stem + ".start.timer": {"UnitFileState": "", "ActiveState": starter},
                            stem + ".start.service": {"UnitFileState": "", "ActiveState": "inactive"}}}


@pytest.mark.parametrize("suite", SUITES)
def test_on_a_fresh_host_every_timer_of_a_present_consumer_is_switched_and_none_of_a_paused_one(suite):
    decided = planned(dict(PLAIN, instances=2), dict(PLAIN, name="held", state="paused"), suite=suite)
    assert decided["timers_to_switch"] == ["batchq-thumbs@1.timer", "batchq-thumbs@2.timer"]


@pytest.mark.parametrize("state, host, switched", [
    ("present", states(), False),
    ("present", states(active="inactive", starter="active"), False),  # its start is scheduled
    ("present", states(active="inactive"), True),  # stopped by hand
    ("present", states(file_state="disabled"), True),  # not started at boot
    ("paused", states(file_state="disabled", active="inactive"), False),
    ("paused", states(), True),
    ("paused", states(file_state="disabled", active="inactive", starter="active"), True),  # it would start
    ("paused", states(active="inactive"), True),  # it would start at boot
])
def test_a_timer_is_switched_only_when_its_states_differ_from_the_consumers_state(state, host, switched):
    decided = planned(dict(PLAIN, state=state), **host)
    assert decided["timers_to_switch"] == (["batchq-thumbs.timer"] if switched else [])


def test_the_unit_files_systemd_has_not_loaded_are_in_the_plan_if_they_are_the_consumers_own():
    # gone is removed; other is not listed, and stays someone else's without consumer_exclusive
    stale = ["batchq-gone.timer", "batchq-other.service", "batchq-thumbs@.timer", "batchq.continue@.service"]
    host = dict(on_host(["batchq-gone.service", "batchq-gone.timer", "batchq-other.service", "batchq-other.timer"]),
                stale_units=stale)
    decided = planned(dict(PLAIN, instances=2), dict(PLAIN, name="gone", state="absent"), **host)
    assert decided["stale_units"] == ["batchq-thumbs@.timer", "batchq.continue@.service"]


@pytest.mark.parametrize("consumer, writes", [
    (PLAIN, False),
    (dict(PLAIN, secret_environment={"TOKEN": "x"}), True),
    (dict(PLAIN, credentials={"token": "x"}), True),
    (dict(PLAIN, hook_credentials={"token": "x"}, on_failure="/usr/bin/logger failed"), True),
    (dict(PLAIN, secret_environment={"TOKEN": "x"}, state="absent"), False),
])
def test_the_secrets_task_runs_only_for_consumers_that_stay_with_secrets(consumer, writes):
    assert planned(consumer)["writes_secrets"] is writes


# Drains whose secrets change end after their batch in flight
def test_each_secret_file_names_the_services_that_read_it():
    keeper = dict(PLAIN, instances=2, secret_environment={"TOKEN": "x"}, backlog_exit_code=75)
    decided = planned(keeper, dict(PLAIN, name="plain"))
    assert decided["drains_by_secret"] == [
        {"path": "/etc/batchq/thumbs.env", "services": ["batchq-thumbs@1.service", "batchq-thumbs@2.service"]}]


# Files: the helpers, the metrics folder and each consumer's metrics files
def test_a_plain_consumer_with_metrics_gets_the_after_run_helpers_and_its_metrics_files():
    files = wanted(PLAIN)
    paths = [entry["path"] for entry in files]
    assert paths[:4] == ["/usr/local/lib/batchq", "/usr/local/lib/batchq/batchq_metrics.py",
                         "/usr/local/lib/batchq/batchq_after_run.py", "/usr/local/lib/batchq/consumer_protocol.py"]
    # then its runtime spec, which the after-run writer reads
    assert paths[4:6] == ["/usr/local/lib/batchq/specs", "/usr/local/lib/batchq/specs/batchq-thumbs.json"]
    # a bare host has no node_exporter: the folder is laid out (consumer_files makes its parents)
    assert files[6] == {"path": "/var/lib/prometheus/node-exporter", "state": "directory", "mode": "a+rx"}
    assert "/var/lib/prometheus/node-exporter/batchq-thumbs.prom" in paths


def test_a_drain_gets_the_runner_too():
    sources = [e.get("source") for e in wanted(dict(PLAIN, backlog_exit_code=75))]
    helpers = DRAIN_HELPERS + AFTER_RUN_HELPERS + SHARED_HELPERS
    assert sources[:1 + len(helpers)] == [None] + list(helpers)


def test_without_metrics_or_hooks_no_helper_is_laid_out_and_metrics_files_go():
    files = wanted(PLAIN, settings={"metrics": False})
    assert not [e for e in files if "source" in e or e["path"] == "/usr/local/lib/batchq"]
    assert {e["state"] for e in files} == {"absent"}


def test_a_hook_needs_the_after_run_helpers_without_metrics():
    hooked = dict(PLAIN, on_failure="/usr/bin/logger failed")
    sources = [e.get("source") for e in wanted(hooked, settings={"metrics": False}) if e.get("source")]
    assert sources == list(AFTER_RUN_HELPERS + SHARED_HELPERS)


def test_no_consumer_left_lays_out_nothing():
    assert wanted(dict(PLAIN, state="absent")) == []


@pytest.mark.parametrize("suite", SUITES)
def test_a_host_with_node_exporter_keeps_its_folder_and_gets_the_rest(suite):
    assert [e["path"] for e in planned(PLAIN, suite=suite)["files_to_lay_out"]] == [
        e["path"] for e in wanted(PLAIN) if e["path"] != "/var/lib/prometheus/node-exporter"]


def test_a_bare_host_without_node_exporter_gets_the_folder_too():
    bare = answers()
    bare["stat"]["/var/lib/prometheus/node-exporter"] = None
    assert plan(units(PLAIN), bare, SETTINGS, "h1")["files_to_lay_out"] == wanted(PLAIN)


def test_a_folder_missing_a_right_the_plan_adds_is_laid_out():
    narrow = answers()
    narrow["stat"]["/var/lib/prometheus/node-exporter"]["mode"] = 0o750
    paths = [e["path"] for e in plan(units(PLAIN), narrow, SETTINGS, "h1")["files_to_lay_out"]]
    assert "/var/lib/prometheus/node-exporter" in paths


def lay_out(files):
    """The entries laid out on this machine as consumer_files does, with its defaults."""
    defaults = {"state": "file", "content": "", "force": True, "src": None, "owner": None, "group": None, "mode": None}
    for entry in files:
        entry = dict(defaults, **entry)
        if consumer_files.needs_change(entry):
            consumer_files.apply(entry)


def test_files_as_consumer_files_lays_them_out_are_as_the_plan_wants_until_one_changes(tmp_path):
    # this machine's own account, so that the test needs no root
    me, mine = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    mine_too = {"user": me, "group": mine, "allow_root": True}  # root, when the tests run as root
    consumers = units(dict(PLAIN, **mine_too), dict(PLAIN, name="held", state="paused", **mine_too))
    settings = dict(SETTINGS, metrics_dir=str(tmp_path / "textfiles"), helper_dir=str(tmp_path / "helpers"))
    host = answers(users={me: {"uid": os.getuid(), "gid": os.getgid(), "home": "/", "shell": "/bin/sh"}},
                   groups={mine: os.getgid()})
    helpers = {name: "# %s\n" % name for name in AFTER_RUN_HELPERS + SHARED_HELPERS}
    lay_out([dict(entry, owner=None, group=None) if entry.get("owner") == "root" else entry
             for entry in with_texts(wanted_files(consumers, settings), helpers.get)])
    host["stat"] = {path: describe(path) for path in questions(consumers, "batchq", settings)["stat"]}
    sources = {name: digest(text) for name, text in helpers.items()}
    unowned = [dict(entry, owner=None, group=None) if entry.get("owner") == "root" else entry
               for entry in wanted_files(consumers, settings)]
    assert files_to_lay_out(unowned, host, sources) == []
    os.chmod(tmp_path / "textfiles" / "batchq-held.paused.prom", 0o600)
    os.unlink(tmp_path / "textfiles" / "batchq-thumbs.prom")
    (tmp_path / "helpers" / "batchq_metrics.py").write_text("# changed by hand\n")
    host["stat"] = {path: describe(path) for path in questions(consumers, "batchq", settings)["stat"]}
    assert [e["path"] for e in files_to_lay_out(unowned, host, sources)] == [
        str(tmp_path / "helpers" / "batchq_metrics.py"), str(tmp_path / "textfiles" / "batchq-thumbs.prom"),
        str(tmp_path / "textfiles" / "batchq-held.paused.prom")]


def test_each_helper_gets_the_text_of_its_source():
    files = with_texts([{"path": "/x/a", "source": "a", "mode": "0755"}, {"path": "/y", "state": "directory"}],
                       lambda name: "text of " + name)
    assert files == [{"path": "/x/a", "mode": "0755", "content": "text of a"}, {"path": "/y", "state": "directory"}]


# Units to write: only those whose content differs from the host's
def test_only_unit_files_the_host_does_not_have_are_written():
    rendered = {"a.service": "[Service]\n", "b.timer": "[Timer]\n", "c.timer": "[Timer]\nOnBootSec=1\n"}
    host = {"a.service": digest("[Service]\n"), "b.timer": digest("[Timer]\nold\n")}
    assert units_to_write(rendered, host) == {"b.timer": "[Timer]\n", "c.timer": "[Timer]\nOnBootSec=1\n"}


def test_the_digest_is_the_one_the_host_reports(tmp_path):
    # the host's side: consumer_preflight hashes the bytes of each unit file
    text = "[Service]\nEnvironment=\"GREETING=h\u00e9llo \u2603\"\n"
    (tmp_path / "batchq-x.service").write_bytes(text.encode("utf-8"))
    assert consumer_preflight.unit_files(str(tmp_path), ["batchq-*"])[0] == {"batchq-x.service": digest(text)}
    assert units_to_write({"batchq-x.service": text}, consumer_preflight.unit_files(str(tmp_path), ["batchq-*"])[0]) == {}


# Removal: what the host has that the consumers no longer want
def on_host(units=(), secrets=()):
    """consumer_preflight's found, for a host with these unit paths (below
    the unit folder) and secret files (in the secrets folder)."""
    return {"found": {UNIT_DIR: sorted("%s/%s" % (UNIT_DIR, path) for path in units),
                      SECRETS_DIR: sorted("%s/%s" % (SECRETS_DIR, name) for name in secrets)}}


THUMBS_ON_HOST = on_host(["batchq-thumbs.service", "batchq-thumbs.timer", "batchq-thumbs.service.d",
                          "timers.target.wants/batchq-thumbs.timer"], ["thumbs.env", "thumbs.token.cred"])


@pytest.mark.parametrize("suite", SUITES)
def test_a_fresh_host_has_nothing_to_remove(suite):
    assert planned(PLAIN, suite=suite)["removal"] == {
        "stop": [], "drain": [], "absent": [], "files": [], "removed": [], "stale_secrets": [], "stale_specs": []}


def test_a_consumer_marked_absent_goes_with_its_units_secrets_hook_state_and_metrics():
    removal = planned(dict(PLAIN, state="absent"), dict(PLAIN, name="other"), **THUMBS_ON_HOST)["removal"]
    assert removal["removed"] == ["thumbs"]
    # its timer (a glob that matches only a loaded unit) and its scheduled starts; its batches of either shape
    assert removal["stop"] == ["batchq-thumbs.*start.timer", "batchq-thumbs.time[r]"]
    assert removal["drain"] == ["batchq-thumbs.service", "batchq-thumbs@*.service"]
    assert sorted(removal["absent"]) == sorted(
        THUMBS_ON_HOST["found"][UNIT_DIR] + THUMBS_ON_HOST["found"][SECRETS_DIR] + ["/var/lib/batchq-hooks/thumbs.json"])
    stem = "/var/lib/prometheus/node-exporter/batchq-thumbs"
    assert [e["path"] for e in removal["files"]] == [stem + suffix for suffix in (".prom", ".paused.prom", ".scale.prom", ".d")]
    assert {e["state"] for e in removal["files"]} == {"absent"}
    # deleted with its units, not again after them
    assert removal["stale_secrets"] == []


# The metrics a deploy moved (consumer_metrics_dir changed) or turned off: gone from the folder the timer's record names
def test_metrics_left_in_another_folder_go_when_they_move_and_with_their_consumer():
    old, new = "/srv/old-metrics", "/srv/new-metrics"
    records = {"batchq-thumbs.timer": old, "batchq-other@.timer": old, "batchq-same.timer": new,
               "batchq-quiet.timer": None, "someone-else.timer": old}
    found = dict(THUMBS_ON_HOST["found"])
    found[UNIT_DIR] = found[UNIT_DIR] + [UNIT_DIR + "/batchq-other@.service", UNIT_DIR + "/batchq-other@.timer"]
    decided = planned(PLAIN, dict(PLAIN, name="other", state="absent"), dict(PLAIN, name="same"),
                      dict(PLAIN, name="quiet"), settings={"metrics_dir": new}, found=found, metrics_dirs=records)
    suffixes = (".prom", ".paused.prom", ".scale.prom", ".d")
    # thumbs stays: its files in the old folder go as the new ones are laid out
    assert [e["path"] for e in decided["files_to_lay_out"] if e["path"].startswith(old)] == [
        old + "/batchq-thumbs" + suffix for suffix in suffixes]
    assert {e["state"] for e in decided["files_to_lay_out"] if e["path"].startswith(old)} == {"absent"}
    # other goes: its files in the new folder (it never wrote there) and in the old one
    assert [e["path"] for e in decided["removal"]["files"]] == [
        folder + "/batchq-other" + suffix for folder in (new, old) for suffix in suffixes]
    # every file that goes: thumbs's and other's in the old folder, other's in the new one, and the scale
    # files no consumer here has now (their instances are no range); same and quiet lose nothing else
    gone = sorted(e["path"] for e in decided["files_to_lay_out"] + decided["removal"]["files"] if e.get("state") == "absent")
    assert gone == sorted([old + "/batchq-thumbs" + suffix for suffix in suffixes]
                          + [folder + "/batchq-other" + suffix for folder in (new, old) for suffix in suffixes]
                          + [new + "/batchq-%s.scale.prom" % name for name in ("thumbs", "same", "quiet")])


def test_a_recorded_metrics_folder_the_role_could_not_have_written_is_left_alone():
    for folder in ("relative", "/", "/srv/../etc"):
        decided = planned(PLAIN, dict(PLAIN, name="other", state="absent"), settings={"metrics_dir": "/srv/new"},
                          metrics_dirs={"batchq-thumbs.timer": folder, "batchq-other.timer": folder},
                          found={UNIT_DIR: [UNIT_DIR + "/batchq-other.timer"]})
        assert not [e for e in decided["files_to_lay_out"] + decided["removal"]["files"]
                    if e.get("state") == "absent" and not e["path"].startswith("/srv/new/")], folder


def test_metrics_turned_off_go_from_the_folder_they_were_in():
    decided = planned(PLAIN, settings={"metrics": False, "metrics_dir": "/srv/new"},
                      metrics_dirs={"batchq-thumbs.timer": "/srv/old"})
    gone = [e["path"] for e in decided["files_to_lay_out"] if e["state"] == "absent"]
    assert "/srv/old/batchq-thumbs.prom" in gone and "/srv/new/batchq-thumbs.prom" in gone


@pytest.mark.parametrize("exclusive, removed", [(False, []), (True, ["thumbs"])])
def test_a_consumer_not_listed_stays_unless_the_list_is_exclusive(exclusive, removed):
    decided = planned(dict(PLAIN, name="other"), settings={"exclusive": exclusive}, **THUMBS_ON_HOST)
    assert decided["removal"]["removed"] == removed
    assert bool(decided["removal"]["absent"]) == exclusive


def test_the_users_own_drop_in_of_a_consumer_that_stays_is_kept():
    removal = planned(dict(PLAIN, secret_environment={"A": "1"}, credentials={"token": "x"}),
                      suite="bullseye", **THUMBS_ON_HOST)["removal"]
    assert removal == {"stop": [], "drain": [], "absent": [], "files": [], "removed": [], "stale_secrets": [], "stale_specs": []}


@pytest.mark.parametrize("instances, host_shape", [(2, ""), (1, "@")])
def test_a_consumer_that_changes_shape_has_the_old_shape_removed_before_its_timers_start(instances, host_shape):
    old = ["batchq-thumbs%s.service" % host_shape, "batchq-thumbs%s.timer" % host_shape]
    decided = planned(dict(PLAIN, instances=instances), units={old[0]: "0" * 64}, **on_host(old))
    assert decided["start_after_removal"] and decided["removal"]["absent"] == ["%s/%s" % (UNIT_DIR, p) for p in old]
    assert decided["removal"]["removed"] == []


def test_fewer_instances_stop_and_remove_the_extra_timers_only():
    host = on_host(["batchq-thumbs@.service", "batchq-thumbs@.timer"]
                   + ["timers.target.wants/batchq-thumbs@%d.timer" % n for n in (1, 2, 3)])
    removal = planned(dict(PLAIN, instances=2), **host)["removal"]
    assert removal["absent"] == [UNIT_DIR + "/timers.target.wants/batchq-thumbs@3.timer"]
    assert removal["drain"] == ["batchq-thumbs@3.service"] and removal["removed"] == []
    # the timer and its scheduled start (the starter unit the role names batchq-NAME.N.start.timer)
    assert removal["stop"] == ["batchq-thumbs.3.start.time[r]", "batchq-thumbs@3.time[r]"]


# Stale secrets: files of consumers that stay but no longer name them
def test_a_secret_environment_taken_away_leaves_a_stale_file():
    removal = planned(PLAIN, **THUMBS_ON_HOST)["removal"]
    assert removal["stale_secrets"] == ["/etc/batchq/thumbs.env", "/etc/batchq/thumbs.token.cred"]
    assert removal["absent"] == []


@pytest.mark.parametrize("suite, stale", [("bullseye", []), ("bookworm", ["/etc/batchq/thumbs.token.cred"])])
def test_a_credential_in_the_form_the_host_no_longer_reads_is_stale(suite, stale):
    # systemd 250 and later read credentials encrypted: the clear file is then stale
    keeper = dict(PLAIN, secret_environment={"A": "1"}, credentials={"token": "x"})
    assert planned(keeper, suite=suite, **THUMBS_ON_HOST)["removal"]["stale_secrets"] == stale


# The filter the role calls: the settings a caller leaves out, switches as strings, answers without a listing
def test_the_filter_takes_the_roles_folders_when_a_caller_gives_none_and_switches_as_strings():
    given = {"account": "batchq", "prefix": "batchq-", "metrics": "false", "metrics_dir": SETTINGS["metrics_dir"],
             "helper_dir": SETTINGS["helper_dir"], "exclusive": "true"}
    decided = consumer_plan_filter(units(dict(PLAIN, name="other")), answers(**THUMBS_ON_HOST), given, "h1")
    assert decided["settings"]["metrics"] is False and decided["settings"]["exclusive"] is True
    assert {k: decided["settings"][k] for k in ("unit_dir", "secrets_dir", "hooks_state_dir")} == {
        "unit_dir": UNIT_DIR, "secrets_dir": SECRETS_DIR, "hooks_state_dir": "/var/lib/batchq-hooks"}
    assert decided["removal"]["removed"] == ["thumbs"]


@pytest.mark.parametrize("key", ["found", "unit_states", "stat", "stale_units"])
def test_the_filter_refuses_answers_to_other_questions_naming_what_they_lack(key):
    without = answers()
    del without[key]
    with pytest.raises(AnsibleFilterError, match="the answers have no %s: " % key):
        consumer_plan_filter(units(PLAIN), without, SETTINGS, "h1")


def test_the_filter_compares_the_helpers_with_the_roles_own_texts(tmp_path):
    host = answers()
    texts = {}
    for name in HELPERS:
        texts[name] = "# the role's %s\n" % name
        (tmp_path / name).write_text(texts[name])
        host["stat"]["/usr/local/lib/batchq/" + name] = {"type": "file", "uid": 0, "gid": 0, "mode": 0o755,
                                                         "sha256": digest(texts[name])}
    host["stat"]["/usr/local/lib/batchq/batchq-drain"]["sha256"] = digest("# an older runner\n")
    host["stat"]["/usr/local/lib/batchq"] = {"type": "directory", "uid": 0, "gid": 0, "mode": 0o755}
    drain = units(dict(PLAIN, backlog_exit_code=75))
    decided = consumer_plan_filter(drain, host, SETTINGS, "h1", str(tmp_path))
    assert [e.get("source") for e in decided["files_to_lay_out"] if e.get("source")] == ["batchq-drain"]
    # without the role's files, every helper a drain with metrics needs counts as different
    decided = consumer_plan_filter(drain, host, SETTINGS, "h1")
    assert [e["source"] for e in decided["files_to_lay_out"] if e.get("source")] == list(
        DRAIN_HELPERS + ("batchq_metrics.py", "batchq_after_run.py") + SHARED_HELPERS)


def test_a_budget_with_a_running_cap_lays_out_the_slots_helper_and_gives_every_consumer_a_spec():
    capped = dict(SETTINGS, metrics=False, budget={"running_max": 3})
    # systemd 252: each unit waits for a slot itself, and its batch runs through the runner
    decided = plan(units(PLAIN), answers(), capped, "h1")
    assert [e["source"] for e in decided["files_to_lay_out"] if e.get("source")] == list(
        DRAIN_HELPERS + ("batchq_slots.py", "batchq_metrics.py") + SHARED_HELPERS)
    assert decided["budget"] == {"cpu_quota": None, "memory_max": None, "tasks_max": None, "running_max": 3,
                                 "waits_in_unit": True}
    spec = decided["runtime"]["thumbs"]["spec"]
    assert (spec["running_max"], spec["runner"], decided["runtime"]["thumbs"]["after_run"]) == (3, True, False)
    # systemd 262: the slice holds starts back; the unit only measures the wait, its batch runs as it is
    decided = plan(units(PLAIN), answers("forky"), capped, "h1")
    assert [e["source"] for e in decided["files_to_lay_out"] if e.get("source")] == list(SLOT_HELPERS + SHARED_HELPERS)
    assert decided["budget"]["waits_in_unit"] is False
    assert decided["runtime"]["thumbs"]["spec"]["runner"] is False
    # no cap: a plain consumer without metrics runs no host-side program
    assert plan(units(PLAIN), answers(), dict(capped, budget={"memory_max": "1G"}), "h1")["runtime"] == {}


@pytest.mark.parametrize("budget, problem", [
    ({"running_max": 0}, "consumer_budget.running_max: must be a whole number from 1 to 1000, got 0"),
    ({"running_max": "two"}, "consumer_budget.running_max: must be a whole number from 1 to 1000, got 'two'"),
    ({"running_max": True}, "consumer_budget.running_max: must be a whole number from 1 to 1000, got True"),
    ({"cpu_quota": "1.5"}, "consumer_budget.cpu_quota: must be a percentage such as '150%', got '1.5'"),
    ({"memory_max": "2 GB"}, "consumer_budget.memory_max: must be bytes with an optional K, M, G or T suffix,"
                             " a percentage or 'infinity', got '2 GB'"),
    ({"tasks_max": -1}, "consumer_budget.tasks_max: must be a whole number from 1 to 4194304 or 'infinity', got -1"),
    ({"running": 2}, "consumer_budget: unknown key 'running' (known: cpu_quota, memory_max, tasks_max, running_max)"),
    (["running_max", 2], "consumer_budget: must be a dict with keys of cpu_quota, memory_max, tasks_max, running_max,"
                         " got ['running_max', 2]"),
])
def test_a_bad_budget_is_refused_naming_the_key(budget, problem):
    decided = plan(units(PLAIN), answers(), dict(SETTINGS, budget=budget), "h1")
    assert problem in decided["problems"]


def test_a_budget_keeps_its_caps_and_sets_only_those_given():
    budget = {"tasks_max": "infinity", "memory_max": "20%", "cpu_quota": None}
    decided = plan(units(PLAIN), answers(), dict(SETTINGS, budget=budget), "h1")
    assert decided["problems"] == []
    assert decided["slice"] == [("MemoryMax", "20%"), ("TasksMax", "infinity")]


# Runtime specs: what the host-side programs read of each consumer
def spec_on_host(decided, name="thumbs"):
    """The spec file the plan lays out for a consumer, read back as the programs read it."""
    path = "/usr/local/lib/batchq/specs/batchq-%s.json" % name
    entry = next(e for e in decided["files_to_lay_out"] if e["path"] == path)
    assert (entry["owner"], entry["group"], entry["mode"]) == ("root", "root", "0644")
    return json.loads(entry["content"])


def test_a_drain_gets_a_runtime_spec_with_all_its_programs_need():
    drain = dict(PLAIN, instances=2, backlog_exit_code=75, timeout="5min", stop_timeout="10s", interval="30s",
                 preload=["json"], command="/usr/bin/python3 /opt/drain.py", on_failure="/usr/bin/logger x")
    decided = planned(drain)
    assert spec_on_host(decided) == {
        "spec_version": 1, "consumer": "thumbs", "services": ["batchq-thumbs@1.service", "batchq-thumbs@2.service"],
        "backlog_exit_code": 75, "timeout_usec": 300000000, "stop_timeout_usec": 10000000, "interval_usec": 30000000,
        "preload": ["json"], "metrics_folder": "/var/lib/prometheus/node-exporter/batchq-thumbs.d",
        "hooks": {"every_usec": 900000000, "on_failure": ["/usr/bin/logger", "x"], "on_recovery": None},
        "hook_credentials": None, "running_max": None, "runner": True, "scale": None}
    assert decided["runtime"]["thumbs"]["after_run"] is True  # its hooks
    assert decided["runtime"]["thumbs"]["spec"] == spec_on_host(decided)


@pytest.mark.parametrize("consumer, settings, after_run", [
    (PLAIN, {}, True),  # metrics after each run
    (dict(PLAIN, backlog_exit_code=75), {}, False),  # the runner writes them after each batch
    (dict(PLAIN, backlog_exit_code=75), {"metrics": False}, False),
    (dict(PLAIN, on_recovery="/usr/bin/logger ok"), {"metrics": False}, True),
    # a plain consumer that waits for a slot itself (systemd 252): its runner writes them
    (PLAIN, {"budget": {"running_max": 2}}, False),
])
def test_the_after_run_writer_runs_only_where_it_has_work(consumer, settings, after_run):
    assert planned(consumer, settings=settings)["runtime"]["thumbs"]["after_run"] is after_run


def test_a_consumer_that_runs_no_host_program_has_no_spec():
    decided = planned(PLAIN, settings={"metrics": False})
    assert decided["runtime"] == {}
    assert not [e for e in decided["files_to_lay_out"] if "/specs" in e["path"]]


@pytest.mark.parametrize("suite, setting", [("bullseye", "plain"), ("bookworm", "encrypted")])
def test_the_spec_names_the_hook_credentials_in_the_form_the_hosts_systemd_reads(suite, setting):
    hooked = dict(PLAIN, on_failure="/usr/bin/logger x", hook_credentials={"token": "t0ken"})
    spec = spec_on_host(planned(hooked, suite=suite))
    suffix = "-encrypted" if setting == "encrypted" else ""
    assert spec["hook_credentials"] == {"encrypted": setting == "encrypted",
                                        "load": ["token:/etc/batchq/thumbs.token.hookcred" + suffix]}
    assert "t0ken" not in json.dumps(spec)


def test_specs_no_consumer_has_go_and_those_of_others_stay():
    folder = "/usr/local/lib/batchq/specs/"
    found = {folder[:-1]: [folder + name for name in (
        "batchq-thumbs.json", "batchq-gone.json", "batchq-someone-elses.json", "batchq-quiet.json")]}
    found[UNIT_DIR] = [UNIT_DIR + "/batchq-gone.service", UNIT_DIR + "/batchq-gone.timer"]
    decided = planned(PLAIN, dict(PLAIN, name="gone", state="absent"), dict(PLAIN, name="quiet"),
                      settings={"metrics": False}, found=found)
    # gone: with its units; quiet: runs no host program now (metrics off)
    assert folder + "batchq-gone.json" in decided["removal"]["absent"]
    assert decided["removal"]["stale_specs"] == [folder + "batchq-quiet.json", folder + "batchq-thumbs.json"]
    assert not [path for path in decided["removal"]["absent"] if "someone-elses" in path]
