"""consumer_control.yml as users run it, on the consumers deployed on the hosts,
with whatever inventory the controller has: none of the deploy's variables (the
role run with vars: in a playbook of one's own), or a consumer_list whose
secrets it cannot template."""

import pathlib
import tempfile

import pytest
import yaml

from testlib import (
    INVENTORY,
    SCENARIO_DIR,
    assert_deployed,
    consumers,
    control,
    control_said,
    deploy,
    host_state,
    journal,
    scenario_vars,
    show,
    start_held_batch,
    wait_for,
)

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()

PAUSED_FILE = "/var/lib/prometheus/node-exporter/batchq-%s.paused.prom"
_INVENTORIES = tempfile.TemporaryDirectory(prefix="batchq-control-")


def inventory(name, group_vars=None):
    """The scenario's hosts in an inventory of their own, without the
    scenario's consumer variables (so no consumer_list), or with these
    instead. How Ansible logs in to the bare host (group_vars/bare.yml) stays."""
    folder = pathlib.Path(_INVENTORIES.name) / name
    (folder / "group_vars").mkdir(parents=True, exist_ok=True)
    (folder / "hosts.yml").write_text(pathlib.Path(INVENTORY).read_text())
    (folder / "group_vars" / "bare.yml").write_text((SCENARIO_DIR / "group_vars" / "bare.yml").read_text())
    if group_vars is not None:
        (folder / "group_vars" / "consumers.yml").write_text(yaml.safe_dump(group_vars))
    return str(folder / "hosts.yml")


WITHOUT_VARS = inventory("without-vars")
# A consumer_list whose secret comes from a vault this run does not have.
VAULTED = inventory("vaulted", {"consumer_list": [
    {"name": "long", "command": "/usr/local/bin/batchq-probe run --hold --tag v1", "start_delay": "1h",
     "secret_environment": {"TOKEN": "{{ vault_token_not_given }}"}}]})


def timer(host, unit):
    return show(host, unit, "ActiveState", "UnitFileState")


def paused_gauge(host, name):
    text = host.check_output("cat %s", PAUSED_FILE % name)
    return [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith("batchq_consumer_paused{")]


# A consumer with instances of these tests' own (parallel's history is
# test_timing's): its batches would come an hour after a deploy or a resume.
TWINS = {"name": "twins", "command": "/usr/local/bin/batchq-probe run", "instances": 2, "start_delay": "1h",
         "accuracy": "1min", "jitter": "2s"}


@pytest.fixture(scope="module", autouse=True)
def twins_deployed():
    """twins deployed beside the scenario's consumers; at the end, twins removed
    and every consumer back as the scenario deployed it."""
    listed = scenario_vars()["consumer_list"]
    assert_deployed(deploy(listed + [TWINS]))
    yield
    assert_deployed(deploy(listed + [dict(TWINS, state="absent")]))


def test_pause_and_resume_consumers_deployed_without_this_inventory(hosts):
    twins = ["batchq-twins@1.timer", "batchq-twins@2.timer"]
    code, output = control("pause", "-e", "consumer_names=twins,long", inventory=WITHOUT_VARS)
    assert code == 0, output
    for host in hosts:
        for unit in twins + ["batchq-long.timer"]:
            assert timer(host, unit) == {"ActiveState": "inactive", "UnitFileState": "disabled"}, unit + output
        assert paused_gauge(host, "long") == ["1"] and paused_gauge(host, "twins") == ["1"], output
        # Nothing in systemd names the instances of a paused consumer any more:
        # their number comes from what the role wrote on the host.
        wait_for(lambda: not host.check_output("systemctl list-units --all --plain --no-legend 'batchq-twins@*'"),
                 30, "systemd to let go of the instances of twins")
    code, output = control("resume", "-e", "consumer_names=twins,long", inventory=WITHOUT_VARS)
    assert code == 0, output
    for host in hosts:
        for unit in twins + ["batchq-long.timer"]:
            assert timer(host, unit)["UnitFileState"] == "enabled", unit + output
        # started as the deploy starts them: start_delay later, with the consumer's accuracy and jitter
        for starter, accuracy, jitter in (("batchq-twins.1.start.timer", "1min", "2s"),
                                          ("batchq-twins.2.start.timer", "1min", "2s"),
                                          ("batchq-long.start.timer", "1s", "0")):
            shown = show(host, starter, "ActiveState", "TimersMonotonic", "AccuracyUSec", "RandomizedDelayUSec")
            assert shown["ActiveState"] == "active" and "OnActiveUSec=1h" in shown["TimersMonotonic"], shown
            assert (shown["AccuracyUSec"], shown["RandomizedDelayUSec"]) == (accuracy, jitter), shown
        assert paused_gauge(host, "long") == ["0"] and paused_gauge(host, "twins") == ["0"], output
    assert "resumed (first batch after start_delay): batchq-long.timer batchq-twins@1.timer batchq-twins@2.timer" \
        in output, output


def test_control_needs_no_secret_of_the_consumer_list(hosts):
    code, output = control("pause", "-e", "consumer_names=long", inventory=VAULTED)
    assert code == 0, output
    for host in hosts:
        assert timer(host, "batchq-long.timer")["ActiveState"] == "inactive", output
    code, output = control("resume", "-e", "consumer_names=long", inventory=VAULTED)
    assert code == 0, output
    for host in hosts:
        assert show(host, "batchq-long.start.timer", "ActiveState")["ActiveState"] == "active", output


@pytest.mark.parametrize("names", ["", " , "])
def test_an_empty_selection_is_refused_and_changes_nothing(hosts, names):
    before = {host: host_state(host) for host in hosts}
    code, output = control("pause", "-e", "consumer_names=" + names, inventory=WITHOUT_VARS)
    assert code != 0 and "consumer_names is empty" in output, output
    for host in hosts:
        assert host_state(host) == before[host], output


def test_a_name_deployed_nowhere_is_refused_before_any_host_changes(hosts):
    before = {host: host_state(host) for host in hosts}
    code, output = control("pause", "-e", "consumer_names=long,nosuch", inventory=WITHOUT_VARS)
    assert code != 0 and "consumer_names: nosuch deployed on none of" in output, output
    for host in hosts:
        assert host_state(host) == before[host], output


# long, with an ExecStopPost= that holds the unit in "deactivating" until released
STOP_RELEASE = "/var/lib/batchq/long/stop-release"
SLOW_STOP = {"service_options": {"ExecStopPost": "/bin/sh -c 'while [ ! -e %s ]; do sleep 0.2; done'" % STOP_RELEASE}}


def test_wait_fails_naming_the_batch_still_running(hosts, release_held_batch):
    for host in hosts:
        host.check_output("rm -f %s", STOP_RELEASE)
    assert_deployed(deploy(consumers(long=SLOW_STOP)))
    try:
        start_held_batch(hosts, "v1")
        # a pause names the batch it leaves to end; long is no drain, so none is asked to end early
        code, output = control("pause", "-e", "consumer_names=long", inventory=WITHOUT_VARS)
        names = [host.backend.get_hostname() for host in hosts]
        assert code == 0 and control_said(output, "batches left to end") == {
            name: ["batchq-long.service"] for name in names}, output
        assert control_said(output, "drains among them end after their batch in flight") == {
            name: [] for name in names}, output
        code, output = control("wait", "-e", "consumer_names=long", "-e", "consumer_wait_timeout=3", inventory=WITHOUT_VARS)
        assert code != 0 and "still running after 3s: batchq-long.service" in output, output
        for host in hosts:  # the batch ends, its ExecStopPost= holds the unit
            host.check_output("touch /var/lib/batchq/long/release")
            wait_for(lambda: show(host, "batchq-long.service", "ActiveState")["ActiveState"] == "deactivating",
                     30, "batchq-long.service to be deactivating")
        code, output = control("wait", "-e", "consumer_names=long", "-e", "consumer_wait_timeout=3", inventory=WITHOUT_VARS)
        assert code != 0 and "still running after 3s: batchq-long.service" in output, output
        for host in hosts:
            assert show(host, "batchq-long.service", "ActiveState")["ActiveState"] == "deactivating", journal(
                host, "long")
            host.check_output("touch %s", STOP_RELEASE)
        code, output = control("wait", "-e", "consumer_names=long", "-e", "consumer_wait_timeout=120", inventory=WITHOUT_VARS)
        assert code == 0 and "no batch running: batchq-long.service" in output, output
        for host in hosts:
            assert show(host, "batchq-long.service", "ActiveState")["ActiveState"] == "inactive", journal(host, "long")
    finally:
        for host in hosts:
            host.check_output("touch %s", STOP_RELEASE)
        # not asserted here: a failure of the test's body must not be hidden; the next deploy resumes it anyway
        control("resume", "-e", "consumer_names=long", inventory=WITHOUT_VARS)


def test_root_without_sudo_runs_both_playbooks_with_ansible_become_false(hosts):
    # the bare host has no sudo to hide
    hidden = [host for host in hosts if host.file("/usr/bin/sudo").exists]
    for host in hidden:
        host.check_output("mv /usr/bin/sudo /usr/bin/sudo.hidden")
    try:
        # what the playbooks' become: true asks for, with sudo, fails on such a host
        code, output = control("run", "-e", "consumer_names=merged", "-e", "ansible_become=true",
                               "-e", "ansible_become_method=sudo", inventory=WITHOUT_VARS)
        assert code != 0 and "sudo: not found" in output, output
        assert all("fatal: [%s]" % host.backend.get_hostname() in output for host in hosts), output
        code, output = control("run", "-e", "consumer_names=merged", "-e", "ansible_become=false", inventory=WITHOUT_VARS)
        assert code == 0 and "started now: batchq-merged.service" in output, output
        code, output = control("status", "-e", "ansible_become=false", playbook="batchq.consumers.consumer_status", inventory=WITHOUT_VARS)
        assert code == 0 and "merged" in output, output
    finally:
        for host in hidden:
            host.check_output("mv /usr/bin/sudo.hidden /usr/bin/sudo")
