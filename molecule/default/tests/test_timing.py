"""The timer fires on a fresh host, serializes, and runs instances in parallel,
judged from the timestamps the consumers wrote themselves."""

import time

from testlib import (activations, assert_deployed, consumer_spec, consumers, deploy, finished, journal, runs,
                     scheduled_starts, show, wait_for)

# The consumers with a short interval whose timers run during these tests (conftest.py): they are what these tests judge.
WATCHES = ("serial", "parallel")

MARGIN = 3.0  # seconds of slack for a loaded CI machine


def test_first_run_follows_start_delay(host):
    # Both times by systemd's clock: when the deploy scheduled the start, and
    # when the timer started the service. The consumer's own first line comes
    # later by its process's start, which took 4 s on a loaded CI machine.
    scheduled = wait_for(lambda: scheduled_starts(host, "batchq-fresh.timer"), 30, "the start of fresh to be scheduled")
    first = wait_for(lambda: activations(host, "batchq-fresh.service"), 30, "the first start of fresh")[0]
    assert wait_for(lambda: runs(host, "fresh"), 30, "the first run of fresh")
    delay = first - scheduled[0]
    assert 3.0 - 0.5 <= delay <= 3.0 + 1.0 + MARGIN, "first run %.2fs after the deploy scheduled it%s" % (
        delay, journal(host, "fresh"))


def test_a_deploy_or_reload_does_not_run_unchanged_consumers_again(hosts):
    """systemd re-arms OnActiveSec= on every daemon-reload:
    the timers have none, so a deploy that changes another consumer, and a
    reload by anyone, leave a consumer that has just run waiting its interval."""
    for host in hosts:
        wait_for(lambda: finished(runs(host, "fresh")), 30, "fresh to finish its first run")
    before = {host: len(runs(host, "fresh")) for host in hosts}
    bystander = {"name": "bystander", "command": "/usr/local/bin/batchq-probe run", "start_delay": "1s"}
    assert_deployed(deploy(consumers(long={"state": "absent"}) + [bystander]))
    for host in hosts:
        host.check_output("systemctl daemon-reload")
    reloaded_at = time.time()
    # The new consumer's first run shows that deploys still start consumers after start_delay.
    for host in hosts:
        first = wait_for(lambda: runs(host, "bystander"), 30, "the first run of the new consumer")[0]
        assert first["start"] - scheduled_starts(host, "batchq-bystander.timer")[-1] >= 1.0 - 0.5, journal(
            host, "bystander")
    # A re-armed fresh would run start_delay (3s) after the reload. Nothing
    # can be waited on for a run that must not come: watch a window well past it.
    time.sleep(max(0.0, reloaded_at + 3.0 + 1.0 + 2 * MARGIN - time.time()))
    for host in hosts:
        assert len(runs(host, "fresh")) == before[host], "fresh ran again after a deploy%s" % journal(host, "fresh")


def test_runs_never_overlap_and_wait_interval(host):
    spec = consumer_spec("serial")
    assert (spec["interval"], spec["accuracy"]) == ("1s", "100ms")
    done = wait_for(lambda: len(finished(runs(host, "serial"))) >= 6 and finished(runs(host, "serial")),
                    120, "six finished runs of serial")
    for previous, current in zip(done, done[1:]):
        gap = current["start"] - previous["end"]
        assert gap >= 1.0 - 0.1, "run started %.3fs after the previous ended%s" % (gap, journal(host, "serial"))
        assert current["end"] - current["start"] >= 3.0, "a run was cut short%s" % journal(host, "serial")


def test_instances_run_in_parallel_each_serialized(host):
    def three_runs_each():
        done = finished(runs(host, "parallel"))
        return all(len([r for r in done if r["instance"] == i]) >= 3 for i in "123") and done

    done = wait_for(three_runs_each, 120, "three finished runs of every instance of parallel")
    for instance in "123":
        own = [r for r in done if r["instance"] == instance]
        for previous, current in zip(own, own[1:]):
            assert current["start"] - previous["end"] >= 4.0 - 0.1, "instance %s overlapped itself%s" % (
                instance, journal(host, "parallel"))
    most_at_once = max(sum(1 for r in done if r["start"] <= t < r["end"]) for t in (r["start"] for r in done))
    assert most_at_once == 3, "at most %d instances ran at once%s" % (most_at_once, journal(host, "parallel"))


def test_units_name_instances_as_documented(host):
    for instance in "123":
        timer = show(host, "batchq-parallel@%s.timer" % instance, "ActiveState", "UnitFileState")
        assert timer == {"ActiveState": "active", "UnitFileState": "enabled"}
    assert host.file("/etc/systemd/system/batchq-parallel@.service").exists
    assert not host.file("/etc/systemd/system/batchq-parallel.service").exists
    assert host.file("/var/lib/batchq/parallel").user == "batchq"
