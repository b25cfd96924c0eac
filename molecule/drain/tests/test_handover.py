"""The hand-over of a drain asked to stop while work waits always happens:
batchq.continue@ runs after every successful run of every drain, as often as
they end, and is never refused by a start limit."""

import time

import pytest

from test_drain import BACKLOG, HAND_OVER_S, batches, fill, idle, kick, left
from testlib import journal, next_elapse, on_every_host_at_once, show, systemd_version, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()

# How long a stopped drain must stay stopped in the test: far beyond start_delay (1s) and the
# continuation's start, far below the interval (1h) to its timer's next elapse.
STAYS_STOPPED_S = 15


def hand_over_mid_drain(host, why_at_once):
    """Fill quick's queue, start its drain, and in its second batch do what a deploy does to a
    drain whose unit changed (consumer_units): USR1 to the runner. The batches since, once drained."""
    unit = "batchq-quick.service"
    before = len(batches(host, "quick"))
    fill(host, "quick", 30)
    kick(host, unit)
    wait_for(lambda: len(batches(host, "quick")) >= before + 2, 30, "two batches of quick")
    host.check_output("systemctl kill --kill-who=main --signal=USR1 %s", unit)
    wait_for(lambda: left(host, "quick") == 0 and idle(host, unit), 60,
             "quick to go on at once and drain the rest (%s)" % why_at_once)
    return batches(host, "quick")[before:]


def test_a_hand_over_after_many_short_runs_goes_on_at_once(host):
    if systemd_version(host) < 250:
        pytest.skip("no OnSuccess= continuation below systemd 250 (test_drain covers what happens instead)")
    unit, continuation = "batchq-quick.service", "batchq.continue@batchq-quick.service"
    # a run on an empty queue ends at once with success, and its continuation
    # runs each time: twelve within seconds, over systemd's default limit of 5 in 10s
    fill(host, "quick", 0)
    host.check_output(" && ".join(["systemctl start %s" % unit] * 12))
    drained = hand_over_mid_drain(host, "its interval is 1h")
    runs = sorted({b["invocation"] for b in drained}, key=[b["invocation"] for b in drained].index)
    assert len(runs) == 2, "the drain did not hand over to a second run%s" % journal(host, "quick")
    first = [b for b in drained if b["invocation"] == runs[0]]
    second = [b for b in drained if b["invocation"] == runs[1]]
    assert first[-1]["status"] == BACKLOG and "end" in first[-1], "the batch in flight was cut short"
    assert second[0]["start"] - first[-1]["end"] < HAND_OVER_S, journal(host, "quick")
    refused = host.run("journalctl --no-pager -o cat -u %s", continuation).stdout
    assert "too quickly" not in refused, refused


def test_a_drain_begun_before_its_timer_started_is_handed_over_at_once(host):
    # Just resumed or deployed: the timer is stopped and its start scheduled start_delay later
    # (the transient <unit>.start.timer, as consumer_units makes it), and `run` began a drain.
    if systemd_version(host) < 250:
        pytest.skip("no OnSuccess= continuation below systemd 250 (test_drain covers what happens instead)")
    host.check_output("systemctl stop batchq-quick.timer")
    host.check_output("systemd-run --quiet --unit=batchq-quick.start --on-active=10min --collect "
                      "--timer-property=RemainAfterElapse=no systemctl start batchq-quick.timer")
    try:
        drained = hand_over_mid_drain(host, "its start 10 min away")
        assert len({b["invocation"] for b in drained}) == 2, \
            "the drain did not hand over to a second run%s" % journal(host, "quick")
    finally:
        host.run("systemctl stop batchq-quick.start.timer")
        host.check_output("systemctl start batchq-quick.timer")


@on_every_host_at_once
def test_a_stop_is_a_stop_and_a_hand_over_still_goes_on_at_once(host):
    name, unit = "stoppable", "batchq-stoppable.service"
    continuation = "batchq.continue@batchq-stoppable.service"
    wait_for(lambda: idle(host, unit), 30, "stoppable to be idle")
    before = len(batches(host, name))
    fill(host, name, 100)
    kick(host, unit)
    # in its second batch, at work (2 s): it answers SIGTERM by then
    wait_for(lambda: len(batches(host, name)) >= before + 2 and "end" not in batches(host, name)[-1], 30,
             "the second batch of stoppable at work")
    continued = show(host, continuation, "InvocationID")["InvocationID"]
    # SIGTERM to the runner and the batch in flight, which commits and exits 75: more work waits
    host.check_output("systemctl stop %s", unit)
    stopped = batches(host, name)[before:]
    assert stopped[-1].get("status") == BACKLOG and left(host, name) > 0, (stopped, journal(host, name))
    # a success, not a failure, and no hand-over
    ended = show(host, unit, "ActiveState", "Result")
    assert ended == {"ActiveState": "inactive", "Result": "success"}, (ended, journal(host, name))
    if systemd_version(host) >= 250:
        # its continuation ran, as after every run that ends well, and started nothing
        wait_for(lambda: show(host, continuation, "InvocationID")["InvocationID"] != continued and idle(host, continuation),
                 30, "the continuation to run after the stop")
    deadline = time.monotonic() + STAYS_STOPPED_S
    while time.monotonic() < deadline:
        assert idle(host, unit) and len(batches(host, name)) == before + len(stopped), \
            "the stopped drain started again%s" % journal(host, name)
        time.sleep(0.5)
    # the drain goes on at its timer's next elapse, an interval (1h) after the stop
    assert next_elapse(host, "batchq-stoppable.timer") - stopped[-1]["end"] > 3600 - 60

    if systemd_version(host) < 250:
        fill(host, name, 0)
        return
    # the same drain handed over (a deploy, a pause: SIGUSR1 to the runner alone) goes on at once
    count = len(batches(host, name))
    kick(host, unit)
    wait_for(lambda: len(batches(host, name)) >= count + 2, 30, "two batches of stoppable")
    host.check_output("systemctl kill --kill-who=main --signal=USR1 %s", unit)
    first = batches(host, name)[count]["invocation"]
    handed = wait_for(lambda: [b for b in batches(host, name)[count:] if b["invocation"] != first], 30,
                      "a batch of the next run")[0]
    fill(host, name, 0)
    wait_for(lambda: idle(host, unit), 30, "stoppable to end on an empty queue")
    last = [b for b in batches(host, name)[count:] if b["invocation"] == first][-1]
    assert last.get("status") == BACKLOG and handed["start"] - last["end"] < HAND_OVER_S, journal(host, name)
