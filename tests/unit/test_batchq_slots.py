"""The slots of the host's budget before systemd 258 (batchq_slots.py): who may
take a slot, which holders are stale, and real processes that contend for
the slots of one folder. Molecule proves the same under systemd."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.batchq.consumers.plugins.module_utils import consumer_protocol, consumer_runs

FILES = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "consumer", "files")
SPEC = importlib.util.spec_from_file_location("batchq_slots", os.path.join(FILES, "batchq_slots.py"))
slots_helper = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(slots_helper)


def test_a_unit_takes_a_free_slot_only_when_no_unit_came_before_it():
    held = {"a.service": ["inv-a"]}
    assert slots_helper.may_take(held, {}, "b.service", 2)
    assert not slots_helper.may_take(held, {}, "b.service", 1)
    waiting = {"c.service": ["inv-c", "10.0"], "b.service": ["inv-b", "12.5"]}
    assert not slots_helper.may_take(held, waiting, "b.service", 2)
    assert slots_helper.may_take(held, waiting, "c.service", 2)
    # a newcomer, not waiting yet, comes after every unit that waits
    assert not slots_helper.may_take(held, waiting, "d.service", 3)
    # a slot the unit holds from an earlier run of its own is no other's
    assert slots_helper.may_take({"b.service": ["old"]}, {}, "b.service", 1)
    # equal arrival: by name, never both
    tied = {"x.service": ["1", "5.0"], "y.service": ["2", "5.0"]}
    assert [slots_helper.first_in_line(tied, unit) for unit in tied] == [True, False]


def test_a_run_that_is_over_leaves_its_slot_stale():
    entries = {"a.service": ["inv-a"], "b.service": ["inv-b"], "c.service": ["inv-c"], "d.service": []}
    live = {"a.service": "inv-a", "b.service": "inv-b2"}  # b runs again, a newer run; c is not active
    assert sorted(slots_helper.stale(entries, live)) == ["b.service", "c.service", "d.service"]


def test_systemctl_show_of_several_units_is_read_unit_by_unit():
    text = "Id=a.service\nInvocationID=1\nActiveState=active\n\nId=b.service\nInvocationID=\nActiveState=inactive\n"
    assert consumer_protocol.parse_show(text) == {
        "a.service": {"Id": "a.service", "InvocationID": "1", "ActiveState": "active"},
        "b.service": {"Id": "b.service", "InvocationID": "", "ActiveState": "inactive"}}


@pytest.mark.parametrize("trigger, previous_end, started, wanted", [
    (100_000_000, 90_000_000, 103_500_000, 3.5),   # the timer started it; systemd held it 3.5 s
    (80_000_000, 90_000_000, 103_500_000, None),   # the timer elapsed before the last run ended: a kick started it
    (0, 0, 5_000_000, None),                       # the timer never elapsed
    (100_000_000, 0, 100_000_000, 0.0),            # its first run, at once
])
def test_on_258_the_wait_counts_from_the_timers_elapse_when_the_timer_started_the_run(trigger, previous_end, started,
                                                                                      wanted):
    service = {"InactiveExitTimestampMonotonic": str(started), "InactiveEnterTimestampMonotonic": str(previous_end)}
    assert slots_helper.queue_wait(service, {"LastTriggerUSecMonotonic": str(trigger)}) == wanted
    # as systemctl prints a timer's LastTriggerUSecMonotonic: a time span
    printed = "%dmin %.6fs" % (trigger // 60_000_000, trigger % 60_000_000 / 1e6) if trigger else "0"
    assert slots_helper.queue_wait(service, {"LastTriggerUSecMonotonic": printed}) == wanted


def test_a_time_span_as_systemctl_prints_it_is_read_to_the_microsecond():
    # recorded from systemd 262's `systemctl show -p LastTriggerUSecMonotonic`
    assert slots_helper.span_usec("10h 4min 28.895612s") == 36268895612
    assert slots_helper.span_usec("1d 2h 500ms") == 93600500000
    assert slots_helper.span_usec("36268900352") == 36268900352
    assert slots_helper.span_usec("0") == 0 and slots_helper.span_usec("") == 0


def test_the_status_of_a_wait_is_read_back_as_it_was_written():
    text = consumer_protocol.slot_status_text(1796637845.9, 2, 2)
    assert text == "waiting for a slot since 2026-12-07 10:04:05 UTC, 2 of 2 taken"
    assert consumer_protocol.parse_slot_status(text) == {"since": 1796637845, "taken": 2, "slots": 2}
    assert consumer_protocol.parse_slot_status("batch 3 ended: success 0 after 0.100s") is None
    assert consumer_protocol.parse_slot_status(None) is None


def test_consumer_info_tells_a_start_that_waits_for_a_slot_on_either_systemd():
    # before 258: the unit waits itself, in start-pre, and says so
    waiting = {"ActiveState": "activating", "SubState": "start-pre",
               "StatusText": consumer_protocol.slot_status_text(1796637845, 2, 2)}
    assert consumer_runs.waits_for_slot(waiting)
    assert not consumer_runs.waits_for_slot(dict(waiting, StatusText=""))  # another ExecStartPre=
    assert not consumer_runs.waits_for_slot(dict(waiting, SubState="start"))
    # from 258: a queued start job, while the slice runs as many units as it allows
    queued, full = {"ActiveState": "inactive", "SubState": "dead", "Job": "135"}, {
        "ConcurrencySoftMax": "2", "NCurrentlyActive": "2"}
    assert consumer_runs.waits_for_slot(queued, full)
    assert not consumer_runs.waits_for_slot(queued, dict(full, NCurrentlyActive="1"))
    assert not consumer_runs.waits_for_slot(queued, dict(full, ConcurrencySoftMax="4294967295"))
    assert not consumer_runs.waits_for_slot(queued, None)
    assert not consumer_runs.waits_for_slot(dict(queued, Job=""), full)


def test_a_wait_is_told_in_the_status_until_the_slot_is_taken(tmp_path):
    clock = {"now": 0.0}
    said = []
    slots = slots_helper.Slots(str(tmp_path))
    slots.put("held", "a.service", ["inv-a"])

    def sleep(seconds):
        clock["now"] += seconds
        if clock["now"] >= 0.7:  # a gives its slot back
            slots_helper.give(slots, "a.service", "inv-a")

    waited = slots_helper.take(slots, "b.service", "inv-b", lambda: 1, live=lambda units: {"a.service": "inv-a"},
                               clock=lambda: clock["now"], sleep=sleep, notify=said.append)
    assert waited == pytest.approx(0.75)
    assert len(said) == 4
    assert all(line.startswith("STATUS=waiting for a slot since ") and line.endswith(", 1 of 1 taken")
               for line in said[:3])
    assert said[3] == "STATUS="  # cleared once the batch has its slot
    assert slots.entries("held") == {"b.service": ["inv-b"]} and slots.entries("waiting") == {}


def test_a_newcomer_waits_behind_a_unit_that_came_first(tmp_path):
    clock = {"now": 20.0}
    slots = slots_helper.Slots(str(tmp_path))
    slots.put("waiting", "b.service", ["inv-b", "10.0"])  # b waits since 10, and looks again soon
    alive = {"b.service": "inv-b"}
    said = []

    def sleep(seconds):
        clock["now"] += seconds
        if not slots.entries("held"):  # b's next look: it takes the free slot
            assert slots_helper.take(slots, "b.service", "inv-b", lambda: 1, live=lambda units: alive,
                                     clock=lambda: clock["now"], notify=lambda m: None) == 0.0
        else:  # then b's batch ends
            slots_helper.give(slots, "b.service", "inv-b")

    slots_helper.take(slots, "c.service", "inv-c", lambda: 1, live=lambda units: alive,
                      clock=lambda: clock["now"], sleep=sleep, notify=said.append)
    # c waited though the slot was free (b came first), then while b held it
    assert [line.rsplit(", ", 1)[-1] for line in said] == ["0 of 1 taken", "1 of 1 taken", "STATUS="]
    assert slots.entries("held") == {"c.service": ["inv-c"]}


def test_a_deploy_that_raises_or_lifts_the_cap_lets_a_waiting_unit_go_on(tmp_path):
    slots = slots_helper.Slots(str(tmp_path))
    slots.put("held", "a.service", ["inv-a"])
    caps = iter([1, 1, 2])
    clock = {"now": 0.0}
    assert slots_helper.take(slots, "b.service", "inv-b", lambda: next(caps), live=lambda units: {"a.service": "inv-a"},
                             clock=lambda: clock["now"], sleep=lambda s: clock.__setitem__("now", clock["now"] + s),
                             notify=lambda m: None) == pytest.approx(0.5)
    assert sorted(slots.entries("held")) == ["a.service", "b.service"]
    # no cap any more: the unit goes on at once, and holds nothing
    assert slots_helper.take(slots, "c.service", "inv-c", lambda: None, clock=lambda: 7.0, notify=lambda m: None) == 0.0
    assert "c.service" not in slots.entries("held")


def test_the_slot_of_a_killed_holder_is_freed_once_systemd_says_its_run_is_over(tmp_path):
    clock = {"now": 0.0}
    slots = slots_helper.Slots(str(tmp_path))
    slots.put("held", "a.service", ["inv-a"])
    asked = []

    def live(units):
        asked.append(sorted(units))
        return {}  # a was killed before it gave its slot back: systemd has no run of it

    waited = slots_helper.take(slots, "b.service", "inv-b", lambda: 1, live=live, clock=lambda: clock["now"],
                               sleep=lambda s: clock.__setitem__("now", clock["now"] + s), notify=lambda m: None)
    assert waited == 0.0 and asked == [["a.service"]]
    assert slots.entries("held") == {"b.service": ["inv-b"]}


CONTENDER = """
import json, os, sys, time
sys.path.insert(0, {files!r})
import importlib.util
spec = importlib.util.spec_from_file_location("batchq_slots", os.path.join({files!r}, "batchq_slots.py"))
helper = importlib.util.module_from_spec(spec); spec.loader.exec_module(helper)
unit, folder, log = sys.argv[1], sys.argv[2], sys.argv[3]
slots = helper.Slots(folder)
alive = lambda units: {{name: (slots.entries("held").get(name) or slots.entries("waiting").get(name))[0]
                       for name in units if name in slots.entries("held") or name in slots.entries("waiting")}}
waited = helper.take(slots, unit, "inv-" + unit, lambda: 2, live=alive, notify=lambda m: None)
with open(log, "a") as out:
    out.write(json.dumps(["took", unit, time.monotonic()]) + "\\n")
time.sleep(0.3)
with open(log, "a") as out:
    out.write(json.dumps(["gave", unit, time.monotonic()]) + "\\n")
helper.give(slots, unit, "inv-" + unit)
"""


def test_five_processes_share_two_slots_never_more_at_once_and_each_gets_one(tmp_path):
    log = tmp_path / "log.jsonl"
    script = CONTENDER.format(files=os.path.abspath(FILES))
    contenders = [subprocess.Popen([sys.executable, "-c", script, "u%d.service" % number, str(tmp_path / "slots"),
                                    str(log)]) for number in range(5)]
    try:
        assert [process.wait(timeout=60) for process in contenders] == [0] * 5
    finally:
        for process in contenders:
            process.kill()
    events = sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda event: event[2])
    holding, most = set(), 0
    for kind, unit, _when in events:
        if kind == "took":
            holding.add(unit)
        else:
            holding.discard(unit)
        most = max(most, len(holding))
    assert most == 2
    assert sorted(unit for kind, unit, _when in events if kind == "took") == ["u%d.service" % n for n in range(5)]
    assert os.listdir(tmp_path / "slots" / "held") == [] and os.listdir(tmp_path / "slots" / "waiting") == []
