"""Re-deploy, pause, resume, remove and exclusive mode, run as users run them:
the deploy playbook against every host at once. A running batch is never killed.

The "long" consumer holds its batch until the test releases it, so "still
running" is a fact the test controls, not a race against the clock.
"""

import pytest

from testlib import (PREFIX, assert_deployed, assert_running, consumers, deploy, finished, host_state, journal,
                     redeploy_during_a_held_batch, release_batch, runs, scheduled_starts, show, start_held_batch,
                     timestamp, wait_for)

# The consumers with a short interval whose timers run during these tests (conftest.py): paused and resumed by these tests.
WATCHES = ("serial",)

UNIT_DIR = "/etc/systemd/system"


pytestmark = pytest.mark.usefixtures("release_held_batch")


def test_redeploy_lets_the_running_batch_finish_and_next_run_is_new(hosts):
    redeploy_during_a_held_batch(hosts)


def test_pause_keeps_units_and_the_running_batch_and_resume_restarts(hosts):
    start_held_batch(hosts, "v1")
    assert_deployed(deploy(consumers(long={"state": "paused"}, serial={"state": "paused"})))
    assert_running(hosts)
    for host in hosts:
        assert show(host, "batchq-serial.timer", "ActiveState", "UnitFileState") == {
            "ActiveState": "inactive", "UnitFileState": "disabled"}
        assert host.file(UNIT_DIR + "/batchq-serial.service").exists
        count = len(runs(host, "serial"))
        # a batch that was running when the timer stopped may still finish
        wait_for(lambda: show(host, "batchq-serial.service", "ActiveState")["ActiveState"] == "inactive",
                 30, "the last serial batch to end")
        paused_count = len(runs(host, "serial"))
        assert paused_count - count <= 1, journal(host, "serial")
    release_batch(hosts, "v1")

    before = {host: len(runs(host, "serial")) for host in hosts}
    assert_deployed(deploy())
    for host in hosts:
        assert show(host, "batchq-serial.timer", "UnitFileState") == {"UnitFileState": "enabled"}
        resumed = wait_for(lambda: runs(host, "serial")[before[host]:], 30, "serial to run again after resume")[0]
        # the first batch after a resume waits start_delay (1s), like one after a fresh deploy
        assert resumed["start"] - scheduled_starts(host, "batchq-serial.timer")[-1] >= 1.0 - 0.5, journal(
            host, "serial")
        wait_for(lambda: show(host, "batchq-serial.timer", "ActiveState") == {"ActiveState": "active"},
                 30, "the serial timer to be active again")


def test_a_change_of_shape_starts_the_new_timers_only_after_the_old_shape_batch(hosts):
    """One instance to two while a batch runs: batchq-long@1 and @2 must not
    run beside the batch of batchq-long, so their timers wait until it ends."""
    start_held_batch(hosts, "v1")
    process = deploy(consumers(long={"instances": 2}), background=True)
    # the deploy waits for the batch of the old shape
    with pytest.raises(AssertionError):
        wait_for(lambda: process.poll() is not None, 10, "the deploy to end")
    assert_running(hosts)
    new_timers = ["batchq-long@1.timer", "batchq-long@2.timer", "batchq-long.1.start.timer", "batchq-long.2.start.timer"]
    for host in hosts:
        states = {unit: show(host, unit, "ActiveState")["ActiveState"] for unit in new_timers}
        assert set(states.values()) == {"inactive"}, (states, journal(host, "long"))
    assert process.poll() is None, "the deploy ended while the batch of the old shape ran"
    release_batch(hosts, "v1")
    process.output = process.communicate(timeout=300)[0]
    assert_deployed(process)
    for host in hosts:
        # the held batch's end (its own record, on the clock systemd uses too), then each new
        # instance's start scheduled (start_delay is 1h: the deploy starts its starter)
        ended = [run for run in finished(runs(host, "long")) if run["tag"] == "v1"][-1]["end"]
        for starter in ("batchq-long.1.start.timer", "batchq-long.2.start.timer"):
            shown = show(host, starter, "ActiveState", "ActiveEnterTimestamp")
            assert shown["ActiveState"] == "active", journal(host, "long")
            assert timestamp(shown["ActiveEnterTimestamp"]) > ended, (starter, shown, ended, journal(host, "long"))
    assert_deployed(deploy())  # back to one instance for the tests that follow


def test_absent_waits_for_the_batch_then_leaves_nothing_behind(hosts):
    for host in hosts:
        host.check_output("mkdir -p %s/batchq-long.service.d && echo '[Service]' > %s/batchq-long.service.d/x.conf",
                          UNIT_DIR, UNIT_DIR)
    start_held_batch(hosts, "v1")
    process = deploy(consumers(long={"state": "absent"}), background=True)
    # The role waits for the batch: the deploy cannot end while it is held.
    with pytest.raises(AssertionError):
        wait_for(lambda: process.poll() is not None, 20, "the deploy to end")
    assert_running(hosts)
    for host in hosts:  # nothing of long goes while its batch runs
        for path in ("batchq-long.service", "batchq-long.timer", "batchq-long.service.d/x.conf"):
            assert host.file("%s/%s" % (UNIT_DIR, path)).exists, path
    assert process.poll() is None, "the deploy ended while the batch ran"
    release_batch(hosts, "v1")
    process.output = process.communicate(timeout=300)[0]
    assert_deployed(process)
    for host in hosts:
        left = host.run("find /etc/systemd /run/systemd/system /var/lib/prometheus/node-exporter "
                        "-name 'batchq-long*'").stdout
        assert left == "", left
        assert show(host, "batchq-long.service", "LoadState")["LoadState"] == "not-found"
        assert host.file("/var/lib/batchq/long/runs.jsonl").exists  # data is kept


def test_absent_removes_a_consumer_with_instances(hosts):
    """There is no plain batchq-parallel.timer to stop: the removal must not trip on it."""
    assert_deployed(deploy(consumers(long={"state": "absent"}, parallel={"state": "absent"})))
    for host in hosts:
        left = host.run("find /etc/systemd /run/systemd/system -name 'batchq-parallel*'").stdout
        assert left == "", left
        wait_for(lambda: host.run("systemctl list-units --all --plain --no-legend 'batchq-parallel*'").stdout.strip() == "",
                 30, "systemd to forget the units of parallel")
    assert_deployed(deploy(consumers(long={"state": "absent"})))  # back for the tests that follow


def test_exclusive_removes_unlisted_consumers_only(hosts):
    """That a consumer not listed stays without consumer_exclusive is the
    planner's decision (tests/unit/test_consumer_plan.py)."""
    stray = {"name": "stray", "command": "/usr/local/bin/batchq-probe run", "start_delay": "1s"}
    listed = consumers(long={"state": "absent"})
    assert_deployed(deploy(listed + [stray]))
    for host in hosts:
        assert host.file(UNIT_DIR + "/batchq-stray.timer").exists
    assert_deployed(deploy(listed, consumer_exclusive=True))
    for host in hosts:
        assert host.run("find /etc/systemd -name 'batchq-stray*'").stdout == ""
        for name in ("fresh", "serial", "verbatim"):
            assert show(host, PREFIX + name + ".timer", "UnitFileState")["UnitFileState"] == "enabled"


def test_removing_the_last_consumer_leaves_no_helper_behind(hosts):
    for host in hosts:
        assert host.file("/usr/local/lib/batchq/batchq-drain").exists  # chatty drains
    assert_deployed(deploy([], consumer_exclusive=True))
    for host in hosts:
        left = host.run("ls -d /usr/local/lib/batchq %s/batchq.continue@.service %s/batchq.slice %s/batchq-* 2>/dev/null",
                        UNIT_DIR, UNIT_DIR, UNIT_DIR).stdout
        assert left == "", left
    assert_deployed(deploy(consumers(long={"state": "absent"})))  # back for the tests that follow
    soon = [c for c in consumers() if c["name"] != "long" and "1h" not in str(c.get("start_delay"))]
    timers = [PREFIX + c["name"] + ("@1" if c.get("instances", 1) > 1 else "") + ".timer" for c in soon]
    for host in hosts:
        assert host.file("/usr/local/lib/batchq/batchq-drain").exists
        # as before the removal: every timer armed again once its start_delay is over
        wait_for(lambda: all(show(host, timer, "ActiveState")["ActiveState"] == "active" for timer in timers), 30,
                 "the timers to be armed again")


def test_check_mode_reports_but_changes_nothing(hosts):
    before = [host_state(host) for host in hosts]
    process = deploy(consumers(long={"state": "absent"}, fresh={"interval": "2h"}), check=True)
    assert_deployed(process)
    assert "-OnUnitInactiveSec=1h" in process.output and "+OnUnitInactiveSec=2h" in process.output, process.output
    assert [host_state(host) for host in hosts] == before
