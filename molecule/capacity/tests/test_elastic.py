"""Instances as a range ({min: 1, max: 4, cooldown: 10s}): one more instance
wakes while a backlog lasts, a start that waits for a slot of the host's
budget (running_max 2) counts as started, an instance above min sleeps once
the queue is empty or cannot be reached, a steady stream does not wake and
put one to sleep by turns, and a reboot brings the consumer back to min.

The consumer is the reference consumer of a spool (examples/spool_queue):
batches of 5 files of 0.2 s, every file done once. Judged from the spool,
the instances' timers and runs, the scaler's records in the journal, a
sampler of the batches every 100 ms, consumer_info and the metrics.
"""

import json
import time

from test_budget import RUNNING_MAX, samples, start_sampler
from testlib import (assert_deployed, consumer_info, consumers, deploy, figure, journal, on_every_host_at_once,
                     restart, scenario_vars, show, span_seconds, wait_for)

SPOOL = scenario_vars()["spool_dir"]
OUTAGE = "/srv/spool-outage"
RANGE = next(c for c in scenario_vars()["consumer_list"] if c["name"] == "elastic")["instances"]
COOLDOWN = span_seconds(RANGE["cooldown"])
INTERVAL = span_seconds(scenario_vars()["consumer_defaults"]["interval"])
NUMBERS = range(1, RANGE["max"] + 1)
SCALER = "batchq.scale@batchq-elastic.service"
# the runner's record of a batch's end (consumer_protocol.BATCH_END)
BATCH_END = "4f3c5a1e9b6d4c0e8a2f7b9d1e3c5a70"
BUDGET_CONSUMERS = ("drain-a", "drain-b", "drain-c", "plain-a", "plain-b")
# in the names of the files: a name is never used twice in a spool, also by a run of these tests before
RUN = "-%d" % time.time()
FILES = 200  # 40 s of work for one instance, some 20 s for the two the budget runs at once


def test_a_deploy_schedules_min_and_leaves_the_others_to_the_backlog(hosts):
    # the budget's consumers rest; the elastic consumer runs
    changed = consumers(elastic={"state": "present"}, **{name: {"state": "paused"} for name in BUDGET_CONSUMERS})
    assert_deployed(deploy(changed))
    for host in hosts:
        # instance 1 comes start_delay after the deploy, as any timer does
        wait_for(lambda: show(host, "batchq-elastic@1.timer", "ActiveState", "UnitFileState") == {
            "ActiveState": "active", "UnitFileState": "enabled"}, 30, "instance 1 of elastic to be scheduled")
        timers = {n: show(host, "batchq-elastic@%d.timer" % n, "ActiveState", "UnitFileState") for n in NUMBERS}
        for number in NUMBERS[1:]:
            assert timers[number]["ActiveState"] == "inactive" and timers[number]["UnitFileState"] != "enabled", timers
        assert show(host, "batchq-elastic.path", "ActiveState")["ActiveState"] == "active"
        report = consumer_info(host, names="elastic", history=0, log_lines=0)["consumers"]
        states = {key: report[key]["state"] for key in report}
        assert states.pop("elastic@1") in ("waiting", "running"), states
        assert states == {"elastic@2": "dormant", "elastic@3": "dormant", "elastic@4": "dormant"}


def stats(host):
    return json.loads(host.check_output("batchq-spool-enqueue --stats --spool %s", SPOOL))


def enqueue(host, count, prefix):
    host.check_output("batchq-spool-enqueue %s --spool %s --prefix %s", str(count), SPOOL, prefix + RUN)


def drained(host, done):
    counts = stats(host)
    return counts["done"] == done and counts["incoming"] == 0 and counts["claims"] == 0 and counts


def idle_spool(host):
    """The spool's counts once no file waits or is claimed: a test counts from there."""
    return wait_for(lambda: drained(host, stats(host)["done"]), 120, "the spool of %s to be idle%s" % (
        host.backend.get_hostname(), journal(host, "elastic")), interval=1)


def scaled_up(host, prefix, instances):
    """Files enough for a drain of some 20 s, enqueued once the spool is idle; returns the
    spool's counts before them, once that many instances are awake."""
    before = idle_spool(host)
    enqueue(host, FILES, prefix)
    wait_for(lambda: len(awake(host)) >= instances, 60, "%d instances to wake on %s" % (
        instances, host.backend.get_hostname()))
    return before


def assert_all_done(host, before):
    """Every file enqueued since before is done once, and none failed."""
    wait_for(lambda: drained(host, before["done"] + FILES), 180, "the spool of %s to drain%s" % (
        host.backend.get_hostname(), journal(host, "elastic")), interval=1)
    assert stats(host)["failed"] == before["failed"]


def dormant_after(host, number, since):
    """When an instance went dormant since a time (the scaler's records in the instance's journal)."""
    out = host.check_output("journalctl --no-pager -o json -u batchq-elastic@%s.service --since @%s",
                            str(number), str(int(since)))
    entries = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [int(entry["__REALTIME_TIMESTAMP"]) / 1e6 for entry in entries
            if str(entry.get("MESSAGE", "")).startswith("instance %d dormant" % number)]


def awake(host):
    """The instances whose timer is on."""
    shown = [show(host, "batchq-elastic@%d.timer" % n, "ActiveState")["ActiveState"] for n in NUMBERS]
    return [n for n, state in zip(NUMBERS, shown) if state in ("active", "activating")]


def wakes(host, since):
    """[(when, instance)] the scaler woke since a time, by systemd's clock."""
    out = host.check_output("journalctl --no-pager -o json -u %s --since @%s", SCALER, str(int(since)))
    found = []
    for line in out.splitlines():
        entry = json.loads(line) if line.strip() else {}
        words = str(entry.get("MESSAGE", "")).split()
        if words[:1] == ["instance"] and words[2:3] == ["woken:"]:
            found.append((int(entry["__REALTIME_TIMESTAMP"]) / 1e6, int(words[1])))
    return [(when, number) for when, number in found if when >= since]


def batch_records(host, number, since):
    """The runner's records of the batches of an instance since a time, oldest first."""
    out = host.check_output("journalctl --no-pager -o json -u batchq-elastic@%s.service MESSAGE_ID=%s --since @%s",
                            str(number), BATCH_END, str(int(since)))
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def batch_ends(host, number, since):
    """[(when, result)] of the batches of an instance since a time, oldest first."""
    return [(int(entry["BATCHQ_ENDED_USEC"]) / 1e6, entry["BATCHQ_RESULT"])
            for entry in batch_records(host, number, since)]


def activations(host, number, since):
    """When an instance's runs began since a time (systemd's "Starting" records)."""
    out = host.check_output("journalctl --no-pager -o json -u batchq-elastic@%s.service "
                            "MESSAGE_ID=7d4958e842da4a758f6c1cdc7b36dcc5 --since @%s", str(number), str(int(since)))
    return [int(json.loads(line)["__REALTIME_TIMESTAMP"]) / 1e6 for line in out.splitlines() if line.strip()]


def metric(host, series):
    """The value of the first series of the scaler's metrics file that begins so."""
    text = host.check_output("cat /var/lib/prometheus/node-exporter/batchq-elastic.scale.prom")
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series))


@on_every_host_at_once
def test_instances_wake_with_the_backlog_and_sleep_when_the_queue_is_empty(host):
    name = host.backend.get_hostname()
    before = idle_spool(host)
    began = float(host.check_output("date +%s.%N"))
    host.check_output(start_sampler("/usr/local/bin/batchq-spool"))
    seen_waiting = []
    try:
        enqueue(host, FILES, "up")

        def all_done():
            report = consumer_info(host, names="elastic", history=0, log_lines=0)["consumers"]
            seen_waiting.extend(key for key in report if report[key]["state"] == "waiting-for-slot")
            return drained(host, before["done"] + FILES)
        wait_for(all_done, 120, "the spool of %s to drain" % name, interval=1)
        emptied = float(host.check_output("date +%s.%N"))
    finally:
        counted = samples(host)
    # Instance 2 started before instance 1's third batch in a row with a backlog ended: its
    # second one asked. (A batch that ran as the files came may have found the queue empty.)
    first = batch_ends(host, 1, began)
    start = [result for when, result in first].index("backlog")
    assert [result for when, result in first[start:start + 3]] == ["backlog"] * 3, first
    second = activations(host, 2, began)
    assert second and second[0] <= first[start + 2][0], (second, first[:start + 3])
    # At most two batches at once (running_max), and the third instance's start waited for a slot:
    # the scaler woke no fourth while it waited.
    assert max(counted) == RUNNING_MAX, counted
    assert "elastic@3" in seen_waiting, seen_waiting
    woken = wakes(host, began)
    assert [number for when, number in woken][:2] == [2, 3], woken
    # (instance 3 may get its slot only as the queue empties: its first batch ends soon after)
    third = wait_for(lambda: batch_records(host, 3, began), 60, "instance 3's first batch on %s" % name)
    third_began = int(third[0]["BATCHQ_STARTED_USEC"]) / 1e6
    assert all(when > third_began for when, number in woken if number == 4), (woken, third_began)
    # Every file done once, none failed.
    assert stats(host)["failed"] == before["failed"]
    # Within an interval of the empty queue (and a margin for a loaded machine), min instances are awake.
    wait_for(lambda: awake(host) == [1], INTERVAL + 10, "instances 2 to 4 of %s to sleep%s" % (
        name, journal(host, "elastic")))
    slept = float(host.check_output("date +%s.%N"))
    report = consumer_info(host, names="elastic", history=0, log_lines=0)["consumers"]
    assert [report["elastic@%d" % n]["state"] for n in NUMBERS[1:]] == ["dormant"] * 3, report
    assert metric(host, "batchq_consumer_active_instances") == 1
    assert [metric(host, 'batchq_consumer_dormant{consumer="elastic",unit="batchq-elastic@%d.service"' % n)
            for n in NUMBERS] == [0, 1, 1, 1]
    figure("elastic {min 1, max 4} under running_max 2 on %s: instance 2 started %.1f s after instance 1's"
           " second batch of backlog ended; %d files in %.0f s; back to 1 instance %.1f s after the queue emptied"
           % (name, second[0] - first[start + 1][0], FILES, emptied - began, slept - emptied))


@on_every_host_at_once
def test_under_a_steady_stream_an_instance_that_woke_stays_awake_for_the_cooldown(host):
    # 7.5 files a second: more than one instance does (5 a second), and the queue empties
    # often. Without a cooldown, an instance would sleep after its first run that empties
    # the queue, and wake again two batches later: again and again.
    before = idle_spool(host)
    began = float(host.check_output("date +%s.%N"))
    rounds = 75
    host.check_output("for i in $(seq 1 %s); do batchq-spool-enqueue 3 --spool %s --prefix s$i%s >/dev/null;"
                      " sleep 0.4; done", str(rounds), SPOOL, RUN)
    ended = float(host.check_output("date +%s.%N"))
    wait_for(lambda: drained(host, before["done"] + 3 * rounds), 60, "the stream to be done")
    woken = wakes(host, began)
    assert woken, "the stream woke no instance"
    assert any(dormant_after(host, number, began) for number in NUMBERS[1:]), "no instance slept"
    for number in NUMBERS[1:]:
        up = sorted(when for when, woke in woken if woke == number)
        down = dormant_after(host, number, began)
        # every sleep comes a cooldown or more after the wake before it (and a second for the
        # records: the scaler writes each line after its systemctl)
        for slept in down:
            wake = max(when for when in up if when <= slept)
            assert slept - wake >= COOLDOWN - 1, (number, up, down)
        assert len(up) <= 1 + (ended - began) / COOLDOWN, (number, up, down)
    figure("elastic: a stream of 7.5 files/s for %.0f s on %s: %d wakes, %d sleeps (cooldown %.0f s)"
           % (ended - began, host.backend.get_hostname(), len(woken),
              sum(len(dormant_after(host, number, began)) for number in NUMBERS[1:]), COOLDOWN))


@on_every_host_at_once
def test_a_queue_that_cannot_be_reached_brings_the_scale_back_to_min_and_loses_nothing(host):
    name = host.backend.get_hostname()
    before = scaled_up(host, "cut", 3)
    cut = time.time()
    host.check_output("touch %s", OUTAGE)
    try:
        # every batch fails now: the instances above min sleep once awake for the cooldown
        wait_for(lambda: awake(host) == [1], COOLDOWN + 4 * INTERVAL + 20, "the scale of %s back to 1%s" % (
            name, journal(host, "elastic")))
        back = time.time()
    finally:
        host.check_output("rm -f %s", OUTAGE)
    assert_all_done(host, before)
    figure("elastic: queue unreachable on %s: back to 1 instance %.0f s after the cut (cooldown %.0f s)"
           % (name, back - cut, COOLDOWN))


@on_every_host_at_once
def test_a_reboot_brings_the_scale_back_to_min_and_loses_nothing(host):
    before = scaled_up(host, "boot", 2)
    booted = restart(host)
    assert_all_done(host, before)
    # After the boot only instance 1 was scheduled: every other instance woke with the backlog, after
    # instance 1's second batch of it.
    first = batch_ends(host, 1, booted)
    start = [result for when, result in first].index("backlog")
    assert wakes(host, booted), "no instance woke after the boot"
    for number in NUMBERS[1:]:
        assert all(when >= first[start + 1][0] for when in activations(host, number, booted)), (number, first)
    for number in NUMBERS[1:]:
        assert show(host, "batchq-elastic@%d.timer" % number, "UnitFileState")["UnitFileState"] != "enabled"
