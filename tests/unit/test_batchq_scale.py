"""Instances as a range (batchq_scale.py, consumer_protocol.ask_for_instance):
which instance wakes, which sleeps after its run, and when a drain asks.
Molecule proves the same under systemd (molecule/capacity/tests/test_elastic.py)."""

import importlib.util
import json
import os

import pytest

from ansible_collections.batchq.consumers.plugins.module_utils import consumer_protocol

FILES = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "consumer", "files")
SPEC = importlib.util.spec_from_file_location("batchq_scale", os.path.join(FILES, "batchq_scale.py"))
scale_helper = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(scale_helper)

RANGE = {"min": 1, "max": 4, "cooldown_usec": 10_000_000, "backlog_exit_code": 75}


def seen(timer="inactive", service="inactive", job=False, main_started=0):
    return {"timer": timer, "service": service, "job": job, "main_started": main_started}


def test_the_lowest_dormant_instance_wakes_while_the_consumer_runs_and_is_below_max():
    view = {1: seen("active", "activating"), 2: seen("active"), 3: seen(), 4: seen()}
    assert scale_helper.to_wake(view, RANGE, {}) == 3
    view[3] = seen("active")
    view[4] = seen("active")
    assert scale_helper.to_wake(view, RANGE, {}) is None  # max awake
    # a paused consumer (instance 1's timer off) wakes none, whatever a drain asked
    paused = {1: seen(), 2: seen(), 3: seen(), 4: seen()}
    assert scale_helper.to_wake(paused, RANGE, {}) is None


@pytest.mark.parametrize("woken_instance, wanted", [
    (seen("active", "inactive", job=True, main_started=5), None),   # its start waits in systemd's queue (258)
    (seen("active", "activating", main_started=5), None),           # it waits for a slot in start-pre (before 258)
    (seen("active", "activating", main_started=20), 3),             # its first batch began after the wake
    (seen("active", "failed", main_started=5), 3),                  # its start failed: it waits for nothing
])
def test_no_more_wake_while_a_woken_instance_still_waits_for_its_first_batch(woken_instance, wanted):
    view = {1: seen("active", "activating", main_started=1), 2: woken_instance, 3: seen(), 4: seen()}
    assert scale_helper.to_wake(view, RANGE, {"2": 10}) == wanted


@pytest.mark.parametrize("number, ended, woken_at, now, sleeps", [
    (2, ("exited", "0"), 0, 10_000_000, True),            # empty queue, awake for the cooldown
    (2, ("exited", "0"), 0, 9_999_999, False),            # empty queue, not awake long enough
    (2, ("exited", "1"), 0, 20_000_000, True),            # a failure: the queue cannot be reached
    (2, ("killed", "TERM"), 0, 20_000_000, True),
    (2, ("exited", "75"), 0, 20_000_000, False),          # handed over to the next run: work waits
    (2, ("exited", "0"), None, 1, True),                  # woken before the record (a deploy, a reboot)
    (1, ("exited", "0"), None, 20_000_000, False),        # min is always scheduled
    (5, ("exited", "75"), 0, 1, True),                    # above a lowered max: at once
])
def test_an_instance_above_min_sleeps_after_a_run_that_did_not_hand_over_once_awake_for_the_cooldown(
        number, ended, woken_at, now, sleeps):
    assert scale_helper.sleeps(number, RANGE, ended, woken_at, now) is sleeps


def test_an_instance_woken_as_the_consumer_was_paused_sleeps_after_its_run_at_once():
    assert scale_helper.sleeps(2, RANGE, ("exited", "75"), 0, 1, is_paused=True)
    assert not scale_helper.sleeps(1, RANGE, ("exited", "0"), None, 1, is_paused=True)  # the pause stopped it


def test_awake_counts_min_and_the_instances_whose_timer_is_on():
    view = {1: seen(), 2: seen("active"), 3: seen("activating"), 4: seen("inactive")}
    assert scale_helper.awake(view, 1) == [1, 2, 3]
    assert scale_helper.awake(view, 2) == [1, 2, 3]


def test_the_record_keeps_the_wakes_of_awake_instances_and_says_how_many_are_awake(tmp_path):
    path = str(tmp_path / "run" / "scale" / "batchq-x.json")
    os.makedirs(os.path.dirname(os.path.dirname(path)), mode=0o700)  # as batchq_slots.py under UMask=0077
    with scale_helper.Record(path) as record:
        record.woken, record.ran = {"2": 5, "3": 6}, {"3"}
        record.write({1: seen(), 2: seen("active"), 3: seen(), 4: seen()}, RANGE)
    with open(path, encoding="utf-8") as handle:
        status = json.load(handle)
    assert (status["woken"], status["ran"], status["awake"], status["max"], status["pending"]) == (
        {"2": 5}, [], 2, 4, False)
    with scale_helper.Record(path) as record:
        assert record.woken == {"2": 5}
    # the drains, another user, can read it
    for folder in (os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        assert os.stat(folder).st_mode & 0o777 == 0o755, folder


def test_a_woken_instance_counts_for_the_alerts_from_the_end_of_its_first_run():
    record = scale_helper.Record.__new__(scale_helper.Record)
    record.woken, record.ran = {"2": 5}, set()
    view = {1: seen("active"), 2: seen("active"), 3: seen(), 4: seen()}
    assert [record.accountable(n, view, 1) for n in (1, 2, 3, 4)] == [True, False, False, False]
    record.ran = {"2"}
    assert [record.accountable(n, view, 1) for n in (1, 2, 3, 4)] == [True, True, False, False]


class FakeHost:
    """systemctl as the scaler calls it: look() answers from views, systemctl() is written down."""

    def __init__(self, monkeypatch, view):
        self.view, self.calls = view, []
        monkeypatch.setattr(scale_helper, "look", lambda spec: {n: dict(v) for n, v in self.view.items()})
        monkeypatch.setattr(scale_helper, "systemctl", lambda *args: self.calls.append(args))


def spec_in(tmp_path, **scale):
    return {"consumer": "x", "backlog_exit_code": 75, "services": ["batchq-x@%d.service" % n for n in (1, 2, 3, 4)],
            "scale": dict({"min": 1, "max": 4, "cooldown_usec": 0, "status": str(tmp_path / "scale" / "x.json"),
                           "metrics_file": str(tmp_path / "x.scale.prom")}, **scale)}


def test_settle_reads_how_the_run_ended_from_systemd_and_stops_the_instances_timer(tmp_path, monkeypatch):
    host = FakeHost(monkeypatch, {1: seen("active"), 2: seen("active"), 3: seen(), 4: seen()})
    spec = spec_in(tmp_path)
    monkeypatch.setenv("EXIT_CODE", "exited")
    monkeypatch.setenv("EXIT_STATUS", "75")  # handed over: stays
    scale_helper.settle(spec, "batchq-x@2.service")
    assert host.calls == []
    monkeypatch.setenv("EXIT_STATUS", "0")  # the queue was empty
    scale_helper.settle(spec, "batchq-x@2.service")
    assert host.calls == [("stop", "--no-block", "--", "batchq-x@2.timer")]
    with open(spec["scale"]["metrics_file"], encoding="utf-8") as handle:
        text = handle.read()
    assert 'batchq_consumer_active_instances{consumer="x"} 1\n' in text
    assert 'batchq_consumer_dormant{consumer="x",unit="batchq-x@2.service"} 1\n' in text


def test_wake_starts_the_lowest_dormant_instance_once_a_second_at_most(tmp_path, monkeypatch):
    host = FakeHost(monkeypatch, {1: seen("active", "activating", main_started=1), 2: seen(), 3: seen(), 4: seen()})
    spec = spec_in(tmp_path)
    scale_helper.wake(spec)
    assert host.calls == [("start", "--", "batchq-x@2.timer"), ("start", "--no-block", "--", "batchq-x@2.service")]
    with open(spec["scale"]["status"], encoding="utf-8") as handle:
        assert json.load(handle)["pending"] is True  # its start is queued: the drains wait
    scale_helper.wake(spec)  # a request within ASK_EVERY: no drain's
    assert len(host.calls) == 2


def test_a_spec_without_a_range_or_no_spec_wakes_nothing(tmp_path, capsys):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(dict(spec_in(tmp_path), scale=None, spec_version=1, timeout_usec=0, stop_timeout_usec=0,
                                    interval_usec=1, preload=[], metrics_folder=None, hooks=None,
                                    hook_credentials=None)))
    assert scale_helper.main(["--spec", str(path), "wake"]) == 0
    assert scale_helper.main(["--spec", str(tmp_path / "gone.json"), "wake"]) == 2
    assert "cannot be read" in capsys.readouterr().err
    assert scale_helper.main(["wake"]) == 2


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def test_a_drain_asks_at_most_once_a_second_and_not_while_every_instance_is_awake(tmp_path):
    scale = {"request": str(tmp_path / "scale-request"), "status": str(tmp_path / "status.json")}
    clock, wall = Clock(100.0), Clock(1000.0)
    asked = consumer_protocol.ask_for_instance(scale, "batchq-x@1.service", None, clock, wall)
    assert asked == 100.0
    with open(scale["request"], encoding="utf-8") as handle:
        assert handle.read() == "batchq-x@1.service\n"
    os.unlink(scale["request"])
    clock.now = 100.5
    assert consumer_protocol.ask_for_instance(scale, "batchq-x@1.service", asked, clock, wall) == asked
    assert not os.path.exists(scale["request"])
    # the scaler's word that no instance may wake holds for NO_WAKE_TRUSTED: all are awake,
    # or one it woke still waits
    clock.now = 102.0
    for status in ({"awake": 4, "max": 4, "pending": False}, {"awake": 2, "max": 4, "pending": True}):
        with open(scale["status"], "w", encoding="utf-8") as handle:
            json.dump(dict(status, written=995.0), handle)
        wall.now = 995.0 + consumer_protocol.NO_WAKE_TRUSTED - 0.5
        assert consumer_protocol.ask_for_instance(scale, "batchq-x@1.service", asked, clock, wall) == asked
        wall.now = 995.0 + consumer_protocol.NO_WAKE_TRUSTED + 0.5
        assert consumer_protocol.ask_for_instance(scale, "batchq-x@1.service", asked, clock, wall) == 102.0
        assert os.path.exists(scale["request"])
        os.unlink(scale["request"])


def test_a_request_that_cannot_be_written_never_fails_the_drain(tmp_path, capsys):
    scale = {"request": str(tmp_path / "missing" / "scale-request"), "status": str(tmp_path / "status.json")}
    assert consumer_protocol.ask_for_instance(scale, "u", None, Clock(5.0), Clock(5.0)) == 5.0
    assert "cannot ask for one more instance" in capsys.readouterr().err
