"""A backlog drains batch after batch, each batch still bounded, isolated and
recorded; an empty queue or a failure waits the interval. Judged from the
records the probe writes per batch (one record set per process)."""

import contextlib
import json

from testlib import (assert_deployed, consumer_info, consumer_spec, consumers, deploy, journal, next_elapse,
                     on_every_host_at_once, scheduled_starts, show, side_by_side, span_seconds, systemd_version,
                     timestamp, timestamp_of, wait_for)

# The consumers with a short interval whose timers run during these tests (conftest.py): their failing drains are judged here.
WATCHES = ("fails-exit", "fails-signal", "fails-hang", "fails-stubborn")

MARGIN = 3.0  # seconds of slack for a loaded CI machine
# The longest wait from a drain's last batch to the next run's first that
# still counts as "at once": the batch's process ends, the ExecStopPost= writer
# runs, the continuation starts the next run, its runner and its first batch
# start. Three Python starts, each up to a second or more on a loaded machine.
# Every consumer the tests hand over waits an hour otherwise.
HAND_OVER_S = 10.0
BACKLOG = 75


def batches(host, name):
    """Every batch a consumer ran, oldest first: its start record, with "end"
    (time) and "status" once it recorded its end, "failing" if it failed on purpose."""
    out = host.run("cat /var/lib/batchq/%s/runs.jsonl 2>/dev/null || true", name)
    by_process = {}
    for line in out.stdout.splitlines():
        record = json.loads(line)
        batch = by_process.setdefault((record["invocation"], record["pid"]), {})
        if record["event"] == "start":
            batch.update(record, start=record["time"])
        elif record["event"] == "end":
            batch.update(end=record["time"], status=record["status"])
        else:
            batch[record["event"]] = record.get("how", True)
    return sorted((b for b in by_process.values() if "start" in b), key=lambda b: b["start"])


def fill(host, name, items):
    # under the consumers' lock, as they read and rewrite the count: a write
    # between a batch's read and its write would be lost, and an emptied queue
    # would fill again with what that batch left. The marker of a failure
    # done goes under the lock too: the probe decides to fail under it.
    host.check_output("flock /srv/queues/%s sh -c 'echo %s > /srv/queues/%s && rm -f /srv/queues/%s.failed'",
                      name, str(items), name, name)


def left(host, name):
    # under the consumers' lock: a batch rewrites the file in place
    return int(host.check_output("flock -s /srv/queues/%s cat /srv/queues/%s", name, name))


def kick(host, *units):
    """Start a batch now, as `consumer_control.yml -e consumer_action=run` would."""
    host.check_output("systemctl start --no-block %s" % " ".join(units))


def idle(host, unit):
    return show(host, unit, "ActiveState")["ActiveState"] in ("inactive", "failed")


def test_a_backlog_drains_back_to_back_then_waits_the_interval(host):
    before = len(batches(host, "drainer"))
    fill(host, "drainer", 200)
    kick(host, "batchq-drainer.service")
    wait_for(lambda: left(host, "drainer") == 0 and idle(host, "batchq-drainer.service"), 120,
             "the drainer to empty its queue")
    drained = batches(host, "drainer")[before:]
    # 20 full batches, then one that finds the queue empty and exits 0
    assert [len(b["items"]) for b in drained] == [10] * 20 + [0], journal(host, "drainer")
    assert [b["status"] for b in drained] == [BACKLOG] * 20 + [0], journal(host, "drainer")
    assert len({b["invocation"] for b in drained}) == 1, "one activation drains the backlog"
    assert sorted(item for b in drained for item in b["items"]) == list(range(1, 201))
    gaps = [later["start"] - earlier["end"] for earlier, later in zip(drained, drained[1:])]
    # back to back: a gap is the end of one Python process and the start of
    # the next (a second on a loaded machine), never the interval (1h)
    assert max(gaps) < MARGIN, "a batch waited %.2fs although work was waiting%s" % (
        max(gaps), journal(host, "drainer"))
    for earlier, later in zip(drained, drained[1:]):
        assert later["start"] >= earlier["end"], "two batches overlapped"
    # the queue is empty: the next batch waits the interval (1h)
    assert next_elapse(host, "batchq-drainer.timer") - drained[-1]["end"] > 3600 - 60


FAILURES = {"fails-exit": "exit-code", "fails-signal": "signal", "fails-hang": "timeout", "fails-stubborn": "timeout"}


def test_a_failure_inside_a_drain_waits_the_interval(host):
    """Each way to fail, in a consumer of its own; the four run side by side."""
    side_by_side(lambda name: fail_a_drain(host, name, FAILURES[name]), sorted(FAILURES))


def fail_a_drain(host, name, result):
    unit = "batchq-%s.service" % name
    before = len(batches(host, name))
    fill(host, name, 100)
    kick(host, unit)
    # The first batch that leaves 50 items or fewer fails (once): 100 -> 90 ... -> 50 fails.
    wait_for(lambda: [b for b in batches(host, name)[before:] if "failing" in b], 60, "the failing batch of %s" % name)
    wait_for(lambda: idle(host, unit), 30, "the failed activation to end")
    failed_run = show(host, unit, "InvocationID", "InactiveEnterTimestamp")
    last = consumer_info(host, names=name)["consumers"][name]["last_run"]
    assert last["result"] == result, journal(host, name)
    if name == "fails-hang":  # killed at its own timeout (3s), not at the drain's
        assert 3.0 - 0.1 <= last["last_batch"]["duration_s"] <= 3.0 + MARGIN, last
        assert last["last_batch"]["exit_status"] == "TERM", last
    if name == "fails-stubborn":  # it ignored SIGTERM: SIGKILL stop_timeout (2s) later
        assert 5.0 - 0.1 <= last["last_batch"]["duration_s"] <= 5.0 + MARGIN, last
        assert last["last_batch"]["exit_status"] == "KILL", last
    # The next run starts the interval after the failure. For two of the
    # drains the test holds the queue's lock meanwhile (the other two time
    # their batches out after 3 s), so that run waits in its first batch, and
    # consumer_info reads the failed run though systemd no longer keeps its status.
    holding = name in ("fails-exit", "fails-signal")
    with queue_lock_held(host, name) if holding else contextlib.nullcontext():
        following = wait_for(lambda: next_run(host, unit, failed_run["InvocationID"]), 60,
                             "the run after the failure", explain=lambda: journal(host, name))
        if holding:
            again = consumer_info(host, names=name)["consumers"][name]["last_run"]
            assert (again["invocation_id"], again["result"], again["batches"], again["last_batch"]) == (
                last["invocation_id"], last["result"], last["batches"], last["last_batch"]), (again, last)
    gap = timestamp(following["InactiveExitTimestamp"]) - timestamp(failed_run["InactiveEnterTimestamp"])
    interval = span_seconds(consumer_spec(name)["interval"])
    assert interval - 0.1 - 0.5 <= gap <= interval + MARGIN, "next run %.2fs after the failure%s" % (
        gap, journal(host, name))
    wait_for(lambda: left(host, name) == 0 and idle(host, unit), 60, "%s to drain the rest" % name)


@contextlib.contextmanager
def queue_lock_held(host, name):
    """The consumer's queue locked by the test (a transient unit of its own), as the consumers lock it."""
    host.check_output("systemd-run --unit=hold-%s --collect flock /srv/queues/%s sleep 120", name, name)
    try:
        wait_for(lambda: host.run("flock -n /srv/queues/%s true", name).rc != 0, 30, "the test to hold the lock")
        yield
    finally:
        host.run("systemctl stop hold-%s", name)


def next_run(host, unit, invocation):
    """The unit's state once a run other than invocation has begun (it may have ended), else None."""
    state = show(host, unit, "InvocationID", "InactiveExitTimestamp")
    return state if state["InvocationID"] not in ("", invocation) else None


@on_every_host_at_once
def test_each_batch_has_its_own_timeout(host):
    """40 batches of 0.3 s run in one activation far longer than timeout (4s),
    also across a daemon-reload, which re-arms systemd's own start timeout."""
    timeout = span_seconds(consumer_spec("slow")["timeout"])
    before = len(batches(host, "slow"))
    fill(host, "slow", 40)
    kick(host, "batchq-slow.service")
    wait_for(lambda: len(batches(host, "slow")) >= before + 10, 60, "ten batches of slow")
    host.check_output("systemctl daemon-reload")
    wait_for(lambda: left(host, "slow") == 0 and idle(host, "batchq-slow.service"), 120, "slow to drain 40 items",
             explain=lambda: slow_story(host))
    drained = batches(host, "slow")[before:]
    # 40 batches of 0.3 s: 12 s of work alone
    assert drained[-1]["end"] - drained[0]["start"] > 2 * timeout, "the drain was not longer than the timeout"
    assert show(host, "batchq-slow.service", "Result")["Result"] == "success", journal(host, "slow")
    assert all("end" in b for b in drained), journal(host, "slow")


def test_no_batch_inherits_what_the_last_one_left_running(host):
    before = len(batches(host, "stray"))
    fill(host, "stray", 5)
    kick(host, "batchq-stray.service")
    wait_for(lambda: left(host, "stray") == 0 and idle(host, "batchq-stray.service"), 60, "stray to drain 5")
    drained = batches(host, "stray")[before:]
    assert len(drained) == 6 and len({b["invocation"] for b in drained}) == 1, journal(host, "stray")
    assert [b["stray_alive"] for b in drained[1:]] == [False] * 5, journal(host, "stray")


def test_instances_share_one_queue_each_serialized(host):
    before = len(batches(host, "shared"))
    fill(host, "shared", 400)
    kick(host, "batchq-shared@1.service", "batchq-shared@2.service")
    wait_for(lambda: left(host, "shared") == 0 and idle(host, "batchq-shared@1.service")
             and idle(host, "batchq-shared@2.service"), 120, "both instances to empty the queue")
    drained = batches(host, "shared")[before:]
    assert sorted(item for b in drained for item in b["items"]) == list(range(1, 401)), "an item was lost or doubled"
    for instance in "12":
        own = [b for b in drained if b["instance"] == instance]
        assert sum(len(b["items"]) for b in own) > 0, "instance %s took no part" % instance
        for earlier, later in zip(own, own[1:]):
            assert later["start"] >= earlier["end"], "instance %s overlapped itself" % instance


def start_slow_drain(hosts, items=1000):
    """A drain of 0.3 s batches that outlasts the test; returns how many batches each host had."""
    before = {}
    for host in hosts:
        wait_for(lambda: idle(host, "batchq-slow.service"), 30, "slow to be idle", explain=lambda: slow_story(host))
        before[host] = len(batches(host, "slow"))
        fill(host, "slow", items)
        kick(host, "batchq-slow.service")
    for host in hosts:
        wait_for(lambda: len(batches(host, "slow")) >= before[host] + 3, 30, "three batches of the slow drain")
    return before


def stop_slow_drain(hosts):
    for host in hosts:
        fill(host, "slow", 0)
        wait_for(lambda: idle(host, "batchq-slow.service"), 30, "the slow drain to end on an empty queue",
                 explain=lambda: slow_story(host))


def slow_story(host):
    """Why slow may still run: the items left, and its journal."""
    return "; %d items left%s" % (left(host, "slow"), journal(host, "slow"))


def test_pause_ends_a_drain_after_its_batch_in_flight_and_resume_goes_on(hosts):
    before = start_slow_drain(hosts)
    assert_deployed(deploy(consumers(slow={"state": "paused"})))
    for host in hosts:
        wait_for(lambda: idle(host, "batchq-slow.service"), 30, "the drain to end after its batch in flight")
        paused = batches(host, "slow")[before[host]:]
        assert all("end" in b for b in paused), "a batch was killed%s" % journal(host, "slow")
        assert paused[-1]["status"] == BACKLOG and left(host, "slow") > 0
        assert show(host, "batchq-slow.timer", "ActiveState", "UnitFileState") == {
            "ActiveState": "inactive", "UnitFileState": "disabled"}
        assert show(host, "batchq-slow.service", "Result")["Result"] == "success", journal(host, "slow")
    counts = {host: len(batches(host, "slow")) for host in hosts}

    assert_deployed(deploy())
    for host in hosts:
        resumed = wait_for(lambda: len(batches(host, "slow")) >= counts[host] + 3 and batches(host, "slow")[counts[host]:],
                           60, "the drain to go on after resume")
        # nothing ran while paused; the first batch after resume waits start_delay (1s)
        assert resumed[0]["start"] - scheduled_starts(host, "batchq-slow.timer")[-1] >= 1.0 - 0.5, journal(host, "slow")
        gaps = [later["start"] - earlier["end"] for earlier, later in zip(resumed, resumed[1:3])]
        assert max(gaps) < MARGIN, "the resumed drain waited %.2fs between batches" % max(gaps)
    stop_slow_drain(hosts)


def test_a_deploy_during_a_drain_hands_over_to_the_new_definition_at_once(hosts):
    """From systemd 250 on (OnSuccess= and its MONITOR_* variables): at once.
    Below, the role leaves that continuation out and says so in the unit: the
    drain ends after its batch in flight and goes on when its timer next fires."""
    before = start_slow_drain(hosts)
    changed = consumers(slow={"command": "/usr/local/bin/batchq-probe drain /srv/queues/slow --limit 1 --work 0.3 --tag v2"})
    assert_deployed(deploy(changed))
    for host in hosts:
        if systemd_version(host) < 250:
            wait_for(lambda: idle(host, "batchq-slow.service"), 30, "the drain to end after its batch in flight")
            drained = batches(host, "slow")[before[host]:]
            assert all(b["tag"] == "v1" for b in drained), "a batch ran at once%s" % journal(host, "slow")
            assert drained[-1]["status"] == BACKLOG and left(host, "slow") > 0
            unit = host.file("/etc/systemd/system/batchq-slow.service").content_string
            assert "\nOnSuccess=" not in unit and "No OnSuccess= continuation: this host's systemd" in unit
            # slow's interval is 1h: the timer, not a continuation, starts the next batch
            assert next_elapse(host, "batchq-slow.timer") - drained[-1]["end"] > 3600 - 60
            kick(host, "batchq-slow.service")
        wait_for(lambda: [b for b in batches(host, "slow")[before[host]:] if b["tag"] == "v2"], 30,
                 "a batch under the new definition")
        drained = batches(host, "slow")[before[host]:]
        last_old = max(i for i, b in enumerate(drained) if b["tag"] == "v1")
        old, new = drained[last_old], drained[last_old + 1]
        assert "end" in old and old["status"] == BACKLOG, "the batch in flight was cut short%s" % journal(host, "slow")
        assert new["tag"] == "v2" and new["invocation"] != old["invocation"]
        if systemd_version(host) >= 250:
            assert new["start"] - old["end"] < HAND_OVER_S, "%.2fs between the old and the new definition%s" % (
                new["start"] - old["end"], journal(host, "slow"))
    assert_deployed(deploy())  # back to v1 for the tests that follow
    stop_slow_drain(hosts)


def test_consumer_info_tells_the_batches_of_a_drain_apart(host):
    wait_for(lambda: idle(host, "batchq-drainer.service"), 30, "drainer to be idle")
    before = len(batches(host, "drainer"))
    fill(host, "drainer", 35)
    kick(host, "batchq-drainer.service")
    wait_for(lambda: left(host, "drainer") == 0 and idle(host, "batchq-drainer.service"), 60, "drainer to drain 35")
    drained = batches(host, "drainer")[before:]  # 10, 10, 10, 5
    report = consumer_info(host, names="drainer", log_lines=10)["consumers"]["drainer"]
    last = report["last_run"]
    assert last["result"] == "success" and last["invocation_id"] == drained[-1]["invocation"].replace("-", "")
    assert last["batches"] == len(drained) == 4
    batch = last["last_batch"]
    assert (batch["number"], batch["result"], batch["exit_status"]) == (4, "success", 0), last
    # the runner's times of the batch enclose the batch's own records; Python's
    # start may take seconds on a loaded CI machine
    started, finished = timestamp_of(batch["started"]), timestamp_of(batch["finished"])
    assert started <= drained[-1]["start"] < started + 10.0, (batch, drained[-1])
    assert drained[-1]["end"] <= finished < drained[-1]["end"] + 10.0, (batch, drained[-1])
    # the log lines are the last batch's own: the probe prints its number there
    assert any('"batch": "4"' in line for line in last["log"]), last["log"]
    assert not [line for line in last["log"] for n in "123" if '"batch": "%s"' % n in line], last["log"]
