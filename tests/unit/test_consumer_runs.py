"""Parsing of systemctl and journal output recorded on Debian 12 (systemd 252)
and Debian 13 (systemd 257) by fixtures/record.sh. The expected values were
read off the raw files by hand."""

import pathlib

import pytest

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_runs import (
    consumer_report,
    consumer_units,
    iso,
    last_run_from_show,
    parse_journal_lines,
    parse_journal_runs,
    parse_show,
    parse_timestamp,
    summarize,
)

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
# distro: (last invocation of ok, of killed, of hung)
LAST = {
    "bookworm": ("31b6a1635e9047d1a337d01635f8123a", "014ca2782e014e1cabdb1142baf42817",
                 "f00a408299df4d6884687cad73e30d20"),
    "trixie": ("66ecc1a43ea143748470bccc35c17f5c", "08421bcf868a4f9093276b2e55fe3684",
               "d84a35918c9c4c218318efafd8706289"),
}
DISTROS = sorted(LAST)


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
    assert found["pair@2"] == {"service": "batchq-pair@2.service", "timer": "batchq-pair@2.timer"}


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
    assert ok["summary"] == {"runs": 3, "failures": 0, "success_rate": 1.0,
                             "mean_duration_s": ok["summary"]["mean_duration_s"]}
    assert 0.3 <= ok["summary"]["mean_duration_s"] < 1.0  # the consumer sleeps 0.3s
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
