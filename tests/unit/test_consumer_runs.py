"""Parsing of systemctl and journal output recorded on Debian 12 (systemd 252)
and Debian 13 (systemd 257) by fixtures/record.sh. The expected values were
read off the raw files by hand."""

import pathlib

import pytest

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_runs import (
    is_drain,
    parse_batch_end,
    parse_batch_status,
    consumer_report,
    consumer_units,
    dormant,
    iso,
    last_run,
    last_run_from_show,
    monotonic_twins,
    parse_journal_lines,
    parse_journal_runs,
    parse_runner,
    parse_timestamp,
    precise_timestamps,
    summarize,
    template_show,
    with_instances,
)
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_unit_states import parse_show

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
# distro: (last invocation of ok, of killed, of hung)
LAST = {
    "bookworm": ("31b6a1635e9047d1a337d01635f8123a", "014ca2782e014e1cabdb1142baf42817",
                 "f00a408299df4d6884687cad73e30d20"),
    "trixie": ("66ecc1a43ea143748470bccc35c17f5c", "08421bcf868a4f9093276b2e55fe3684",
               "d84a35918c9c4c218318efafd8706289"),
}
DISTROS = sorted(LAST)
# Mean of journal-ok.json's three runs, from "Starting" to "Finished" (__REALTIME_TIMESTAMP,
# subtracted by hand): bookworm 0.390000, 0.382213, 0.370463 s; trixie 0.375912, 0.370898, 0.389967 s.
# By the manager's own stamps (_SOURCE_REALTIME_TIMESTAMP of its job messages),
# worked out by hand from the files: bookworm 0.390, 0.382, 0.371; trixie 0.376, 0.372, 0.393.
MEAN_OK = {"bookworm": 0.381, "trixie": 0.38}
# record-states.sh: envfile's successful run, then the start that found no environment file.
ENVFILE = {
    "bookworm": ("74d544acf47b4756b4a91ae067e4ff72", "1738b021d08d4a5a809eecb9ba46535e", 1796041234.962325),
    "trixie": ("629f53bf1def490d8f48d144c3bb74c9", "2f9d972eb647450ba03cac7cdb31ee4a", 1796041236.378038),
}


def fixture(distro, name):
    return (FIXTURES / distro / name).read_text()


def test_timestamps():
    assert parse_timestamp("Sun 2026-11-29 12:04:56.749330 UTC") == pytest.approx(1795953896.74933)
    assert parse_timestamp("Sun 2026-11-29 12:04:56 UTC") == pytest.approx(1795953896.0)
    assert parse_timestamp("") is None and parse_timestamp("n/a") is None
    assert iso(1795953896.74933) == "2026-11-29T12:04:56.749330Z"
    with pytest.raises(ValueError):
        parse_timestamp("Sun 2026-11-29 12:04:56 CET")


@pytest.mark.parametrize("distro", DISTROS)
def test_units_found_on_the_host(distro):
    found = consumer_units(fixture(distro, "units.txt"), "batchq-")
    assert sorted(found) == ["busy", "exit3", "hog", "hung", "killed", "never", "ok", "pair@1", "pair@2"]
    assert found["pair@2"] == {"service": "batchq-pair@2.service", "timer": "batchq-pair@2.timer",
                               "starter": "batchq-pair.2.start.timer"}
    assert found["ok"]["starter"] == "batchq-ok.start.timer"


@pytest.mark.parametrize("distro", DISTROS)
def test_units_of_another_prefix_are_not_ours(distro):
    assert consumer_units(fixture(distro, "units.txt"), "other-") == {}
    assert sorted(consumer_units(fixture(distro, "units.txt"), "batchq-p")) == ["air@1", "air@2"]


@pytest.mark.parametrize("distro", DISTROS)
def test_paused_consumer_with_instances_is_paused_under_its_bare_name(distro):
    found = consumer_units(fixture(distro, "units-paused.txt"), "batchq-")
    assert found == {"pair": {"service": "batchq-pair@.service", "timer": "batchq-pair@.timer",
                              "template": "disabled"}}
    service, timer = template_show(found["pair"])
    report, warnings = consumer_report(service, timer, [], [], 5, 0.0, 0.0)
    assert report["state"] == "paused" and warnings == []
    assert report["timer"] == {"enabled": False, "active": False, "last_trigger": None, "next_run": None}
    assert report["last_run"] is None and report["history"] == []


def test_template_with_an_enabled_instance_but_none_loaded_is_stopped():
    service, timer = template_show({"service": "batchq-pair@.service", "timer": "batchq-pair@.timer",
                                    "template": "indirect"})
    assert consumer_report(service, timer, [], [], 5, 0.0, 0.0)[0]["state"] == "stopped"


@pytest.mark.parametrize("distro", DISTROS)
def test_timer_armed_by_the_starter_is_waiting_until_the_starter_fires(distro):
    services = parse_show(fixture(distro, "show-services.txt"))
    timers = parse_show(fixture(distro, "show-starting.txt"))
    report = consumer_report(services["batchq-ok.service"], timers["batchq-starting.timer"], [], [], 5,
                             2000000000.0, 0.0, timers["batchq-starting.start.timer"])[0]
    assert report["state"] == "waiting"
    assert report["timer"]["enabled"] is True and report["timer"]["active"] is False
    # the starter's NextElapseUSecMonotonic, 1h 11min 21.944887s (bookworm), from a monotonic clock at 0
    assert report["timer"]["next_run"] == {"bookworm": "2033-05-18T04:44:41.944887Z",
                                           "trixie": "2033-05-18T04:44:43.323049Z"}[distro]
    failed = consumer_report(services["batchq-exit3.service"], timers["batchq-starting.timer"], [], [], 5,
                             0.0, 0.0, timers["batchq-starting.start.timer"])[0]
    assert failed["state"] == "failed"


@pytest.mark.parametrize("distro", DISTROS)
def test_timer_stopped_by_hand_or_failed_is_stopped_not_paused(distro):
    services = parse_show(fixture(distro, "show-services.txt"))
    timers = parse_show(fixture(distro, "show-starting.txt"))
    stopped = consumer_report(services["batchq-ok.service"], timers["batchq-stopped.timer"], [], [], 5, 0.0, 0.0,
                              timers["batchq-stopped.start.timer"])[0]
    assert stopped["state"] == "stopped" and stopped["timer"]["next_run"] is None
    failed_timer = dict(timers["batchq-stopped.timer"], ActiveState="failed")
    assert consumer_report(services["batchq-ok.service"], failed_timer, [], [], 5, 0.0, 0.0)[0]["state"] == "stopped"
    disabled_but_failed = dict(failed_timer, UnitFileState="disabled")
    assert consumer_report(services["batchq-ok.service"], disabled_but_failed, [], [], 5, 0.0, 0.0)[0]["state"] \
        == "stopped"


@pytest.mark.parametrize("distro", DISTROS)
def test_start_that_failed_before_exec_is_the_last_run_alone(distro):
    previous, failed, ended = ENVFILE[distro]
    service = parse_show(fixture(distro, "show-resources.txt"))["batchq-envfile.service"]
    runs = parse_journal_runs(fixture(distro, "journal-resources.json"))
    assert [r["invocation_id"] for r in runs] == [failed, previous]
    run, lost = last_run(service, runs)
    assert not lost
    assert (run["invocation_id"], run["result"], run["exit_code"], run["exit_status"]) == (failed, "resources", None, None)
    assert run["started"] is None and run["finished"] == pytest.approx(ended) and run["duration_s"] is None
    timers = parse_show(fixture(distro, "show-timers.txt"))
    report, warnings = consumer_report(service, timers["batchq-ok.timer"], runs, [], 5, 0.0, 0.0)
    assert report["state"] == "failed" and warnings == []
    assert report["last_run"]["invocation_id"] == failed and report["summary"]["failures"] == 1


@pytest.mark.parametrize("distro", DISTROS)
def test_start_that_failed_before_exec_with_the_journal_lost(distro):
    previous, failed, ended = ENVFILE[distro]
    service = parse_show(fixture(distro, "show-resources.txt"))["batchq-envfile.service"]
    run, lost = last_run(service, [])
    assert lost and (run["invocation_id"], run["result"], run["exit_code"]) == (failed, "resources", None)
    assert run["finished"] == pytest.approx(parse_timestamp(service["StateChangeTimestamp"]))


def test_main_process_of_an_earlier_run_is_not_taken_for_the_last_run():
    # what a start that fails before exec would show if ExecMain* kept the earlier run's process
    service = {"Id": "batchq-x.service", "LoadState": "loaded", "ActiveState": "failed", "Result": "resources",
               "InvocationID": "new", "ExecMainCode": "1", "ExecMainStatus": "0",
               "ExecMainStartTimestamp": "Sun 2026-11-29 12:00:00.000000 UTC",
               "ExecMainExitTimestamp": "Sun 2026-11-29 12:00:01.000000 UTC",
               "InactiveExitTimestamp": "Sun 2026-11-29 12:00:00.000100 UTC",
               "StateChangeTimestamp": "Sun 2026-11-29 12:10:00.000000 UTC"}
    journal = [{"invocation_id": "new", "started": None, "finished": parse_timestamp(service["StateChangeTimestamp"]),
                "duration_s": None, "result": "resources", "exit_code": None, "exit_status": None},
               {"invocation_id": "old", "started": parse_timestamp(service["ExecMainStartTimestamp"]),
                "finished": parse_timestamp(service["ExecMainExitTimestamp"]), "duration_s": 1.0,
                "result": "success", "exit_code": "exited", "exit_status": 0}]
    run = last_run(service, journal)[0]
    assert (run["invocation_id"], run["result"], run["exit_code"], run["started"]) == ("new", "resources", None, None)
    journal[0]["started"] = parse_timestamp("Sun 2026-11-29 12:09:59.000000 UTC")
    run = last_run(service, journal)[0]
    assert (run["exit_code"], run["started"]) == (None, journal[0]["started"])


@pytest.mark.parametrize("distro", DISTROS)
def test_show_of_many_units(distro):
    services = parse_show(fixture(distro, "show-services.txt"))
    assert services["batchq-exit3.service"]["Result"] == "exit-code"
    assert services["batchq-exit3.service"]["ExecMainStatus"] == "3"
    assert services["batchq-busy.service"]["ActiveState"] == "activating"
    assert services["batchq-ghost.service"]["LoadState"] == "not-found"


@pytest.mark.parametrize("distro", DISTROS)
def test_last_run_as_systemd_describes_it(distro):
    services = parse_show(fixture(distro, "show-services.txt"))
    ok, killed, hung = LAST[distro]
    assert last_run_from_show(services["batchq-ok.service"])["invocation_id"] == ok
    run = last_run_from_show(services["batchq-killed.service"])
    assert (run["invocation_id"], run["result"], run["exit_code"], run["exit_status"]) == (killed, "signal", "killed", "KILL")
    run = last_run_from_show(services["batchq-hung.service"])
    assert (run["result"], run["exit_status"]) == ("timeout", "TERM")
    assert run["duration_s"] >= 2.0  # its timeout is 2s
    assert last_run_from_show(services["batchq-never.service"]) is None


@pytest.mark.parametrize("distro", DISTROS)
def test_runs_from_the_journal(distro):
    ok, killed, hung = LAST[distro]
    runs = parse_journal_runs(fixture(distro, "journal-ok.json"))
    assert len(runs) == 3 and runs[0]["invocation_id"] == ok
    assert all((r["result"], r["exit_code"], r["exit_status"]) == ("success", "exited", 0) for r in runs)
    assert all(r["finished"] > r["started"] for r in runs)
    runs = parse_journal_runs(fixture(distro, "journal-killed.json"))
    assert (runs[0]["invocation_id"], runs[0]["result"], runs[0]["exit_status"]) == (killed, "signal", "KILL")
    runs = parse_journal_runs(fixture(distro, "journal-hung.json"))
    assert (runs[0]["invocation_id"], runs[0]["result"], runs[0]["exit_status"]) == (hung, "timeout", "TERM")
    runs = parse_journal_runs(fixture(distro, "journal-exit3.json"))
    assert [(r["result"], r["exit_code"], r["exit_status"]) for r in runs] == [("exit-code", "exited", 3)] * 3


@pytest.mark.parametrize("distro", DISTROS)
def test_report_of_each_outcome(distro):
    services = parse_show(fixture(distro, "show-services.txt"))
    timers = parse_show(fixture(distro, "show-timers.txt"))

    def report(name, journal=""):
        return consumer_report(services["batchq-%s.service" % name], timers.get("batchq-%s.timer" % name, {}),
                               parse_journal_runs(journal), [], 5, 2000000000.0, 0.0)

    ok, warnings = report("ok", fixture(distro, "journal-ok.json"))
    assert ok["state"] == "waiting" and warnings == []
    assert ok["summary"] == {"runs": 3, "failures": 0, "success_rate": 1.0, "mean_duration_s": MEAN_OK[distro]}
    assert ok["timer"]["enabled"] and ok["timer"]["active"] and ok["timer"]["next_run"].startswith("2033-")
    hung = report("hung", fixture(distro, "journal-hung.json"))[0]
    assert hung["state"] == "failed" and hung["summary"]["failures"] == 3
    never = report("never")[0]
    assert never["state"] == "paused" and never["last_run"] is None and never["history"] == []
    busy = report("busy")[0]
    assert busy["state"] == "running" and busy["running_since"].startswith("2026-11-29T")
    assert report("ghost")[0]["state"] == "missing"


@pytest.mark.parametrize("distro", DISTROS)
def test_a_run_the_journal_lost_is_still_reported_with_a_warning(distro):
    services = parse_show(fixture(distro, "show-services.txt"))
    timers = parse_show(fixture(distro, "show-timers.txt"))
    report, warnings = consumer_report(services["batchq-ok.service"], timers["batchq-ok.timer"], [], [], 5, 0.0, 0.0)
    assert report["last_run"]["invocation_id"] == LAST[distro][0]
    assert report["history"] == [] and len(warnings) == 1 and LAST[distro][0] in warnings[0]


def test_journal_lines_decode_bytes():
    text = '{"MESSAGE": "plain"}\n{"MESSAGE": [104, 105, 255]}\n'
    assert parse_journal_lines(text) == ["plain", "hi\ufffd"]


def test_summary_of_no_runs():
    assert summarize([]) == {"runs": 0, "failures": 0, "success_rate": None, "mean_duration_s": None}


# Read off the recorded files by hand (record-batches.sh): number, result,
# exit status, start and end.
BATCH_ENDS = [
    ("bookworm", "timeout", (5, "timeout", "TERM", 1796043685.483281, 1796043688.486189, 3.003)),
    ("bookworm", "backlog", (40, "backlog", 75, 1796043881.864163, 1796043882.207003, 0.343)),
    ("trixie", "timeout", (5, "timeout", "TERM", 1796043733.593903, 1796043736.600627, 3.007)),
    ("trixie", "backlog", (4, "backlog", 75, 1796043882.593818, 1796043882.929213, 0.335)),
]


@pytest.mark.parametrize("distro, result, expected", BATCH_ENDS)
def test_the_last_batch_of_a_drain_from_its_end_record(distro, result, expected):
    batch = parse_batch_end(fixture(distro, "batch-end-%s.json" % result))
    assert (batch["number"], batch["result"], batch["exit_status"], batch["started"], batch["finished"],
            batch["duration_s"]) == pytest.approx(expected)


def test_no_end_record_no_batch():
    assert parse_batch_end("") is None


# What batchq-drain leaves in its unit's StatusText, as the runner writes it.
@pytest.mark.parametrize("text, expected", [
    ("batch 200 ended: success 0 after 0.004s", (200, "success", 0, 0.004)),
    ("batch 12 ended: backlog 75 after 0.103s", (12, "backlog", 75, 0.103)),
    ("batch 5 ended: timeout TERM after 3.003s", (5, "timeout", "TERM", 3.003)),
    ("batch 1 ended: exit-code 1 after 12.500s", (1, "exit-code", 1, 12.5)),
])
def test_the_last_batch_of_a_drain_from_its_status_text(text, expected):
    batch = parse_batch_status(text)
    assert (batch["number"], batch["result"], batch["exit_status"], batch["duration_s"]) == expected
    assert batch["started"] is None and batch["finished"] is None


# record-runner.sh: the first of two runs; its runner's PID read off the
# recorded journal by hand (batchq-drain[148] on bookworm, [190] on trixie).
RUNNERS = {"bookworm": 148, "trixie": 190}


@pytest.mark.parametrize("distro", DISTROS)
def test_the_runner_of_an_older_run_from_its_start_record(distro):
    assert parse_runner(fixture(distro, "runner-start.json")) == RUNNERS[distro]


def test_a_start_record_written_after_the_runners_is_not_the_runners():
    # A batch could send a record with the same MESSAGE_ID, but only after the
    # runner's own: the first one names the runner.
    recorded = fixture("trixie", "runner-start.json").strip()
    forged = recorded.replace('"_PID":"190"', '"_PID":"4242"')
    assert parse_runner(recorded + "\n" + forged + "\n") == 190


def test_no_start_record_no_runner():
    assert parse_runner("") == 0


@pytest.mark.parametrize("text", ["", None, "processing", "batch 3 ended: success 0 after 0.1s\nbatch 4"])
def test_no_status_text_of_the_runner_no_batch(text):
    assert parse_batch_status(text) is None


def test_a_drain_is_told_by_its_runner():
    assert is_drain({"ExecStart": "{ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -I "
                                  "/usr/local/lib/batchq/batchq-drain 75 0 30000000 -- /bin/true ; }"})
    assert not is_drain({"ExecStart": "{ path=/bin/true ; argv[]=/bin/true ; }"})


def test_whole_seconds_of_systemd_247_get_their_microseconds_from_the_monotonic_twin():
    """Recorded on Debian 11 with the clock pair read just before; D-Bus gave
    ExecMainStartTimestamp=1796084732678436 µs for the same run."""
    recorded = (FIXTURES / "bullseye" / "show-timestamps.txt").read_text()
    units = precise_timestamps(parse_show(recorded), 1796084732.7052126, 44179.917458666)
    service = units["systemd-tmpfiles-clean.service"]
    assert abs(parse_timestamp(service["ExecMainStartTimestamp"]) - 1796084732.678436) < 0.0001
    # 17.5 ms between start and exit, where the whole seconds said 0
    assert round(parse_timestamp(service["ExecMainExitTimestamp"]) - parse_timestamp(service["ExecMainStartTimestamp"]),
                 4) == 0.0175
    # a timer never triggered keeps its empty value
    assert units["systemd-tmpfiles-clean.timer"]["LastTriggerUSec"] == ""


def test_timestamps_with_microseconds_are_left_as_systemd_printed_them():
    text = "Id=a.service\nExecMainStartTimestamp=Tue 2026-12-01 00:25:32.123456 UTC\n" \
           "ExecMainStartTimestampMonotonic=44179890677\n"
    units = precise_timestamps(parse_show(text), 1796084732.7052126, 44179.917458666)
    assert units["a.service"]["ExecMainStartTimestamp"] == "Tue 2026-12-01 00:25:32.123456 UTC"
    assert monotonic_twins(["Id", "ExecMainStartTimestamp", "LastTriggerUSec"]) == ["ExecMainStartTimestampMonotonic"]


def test_a_timers_monotonic_time_span_is_no_twin():
    """systemd 247 prints LastTriggerUSecMonotonic as a time span (seen on Debian 11)."""
    text = "Id=a.timer\nLastTriggerUSec=Tue 2026-12-01 00:25:32 UTC\nLastTriggerUSecMonotonic=12h 20min 37.386257s\n"
    units = precise_timestamps(parse_show(text), 1796084732.7052126, 44179.917458666)
    assert units["a.timer"]["LastTriggerUSec"] == "Tue 2026-12-01 00:25:32 UTC"


def test_every_instance_of_a_range_is_reported_loaded_or_not():
    found = {"x": {"service": "batchq-x@.service", "timer": "batchq-x@.timer", "template": "enabled"},
             "y": {"service": "batchq-y.service", "timer": "batchq-y.timer", "starter": "batchq-y.start.timer"}}
    ranged = with_instances(found, "x", "batchq-", 3)
    assert sorted(ranged) == ["x@1", "x@2", "x@3", "y"]
    assert ranged["x@2"] == {"service": "batchq-x@2.service", "timer": "batchq-x@2.timer",
                             "starter": "batchq-x.2.start.timer"}


def test_an_instance_of_a_range_that_sleeps_is_dormant_unless_the_consumer_is_paused():
    def reports(*states):
        return {"x@%d" % number: {"state": state} for number, state in enumerate(states, 1)}
    shown = dormant(reports("running", "paused", "stopped", "waiting"), "x", 1)
    assert [shown["x@%d" % n]["state"] for n in (1, 2, 3, 4)] == ["running", "dormant", "stopped", "waiting"]
    # min 2: the second instance is always scheduled, and stays as it is
    assert dormant(reports("waiting", "paused"), "x", 2)["x@2"]["state"] == "paused"
    # paused by the role: every instance is paused
    assert [r["state"] for r in dormant(reports("paused", "paused"), "x", 1).values()] == ["paused"] * 2
