"""The hand-over of a drain asked to stop while work waits always happens:
batchq.continue@ runs after every successful run of every drain, as often as
they end, and is never refused by a start limit."""

import pytest

from test_drain import BACKLOG, MARGIN, batches, fill, idle, kick, left
from testlib import journal, systemd_version, wait_for


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
    assert second[0]["start"] - first[-1]["end"] < 2.0 + MARGIN, journal(host, "quick")
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
