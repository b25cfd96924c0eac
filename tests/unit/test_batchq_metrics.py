"""The metrics writer's pure parts: a file it wrote is read back, and counters go on."""

import importlib.util
import os
import sys

FILES = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "consumer", "files")
WRITER = os.path.join(FILES, "batchq_metrics.py")
# As on a host: the run protocol is installed beside the writer, and its callers put that folder in sys.path.
sys.path.insert(0, FILES)
SPEC = importlib.util.spec_from_file_location("batchq_metrics", WRITER)
metrics = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(metrics)

UNIT = "batchq-mail.service"


def run(result, status=0, started=1000.0, ended=1002.5):
    return {"result": result, "status": status, "started": started, "ended": ended}


def series_after(*runs, unit=UNIT, interval=60.0, timeout=3600.0):
    series = {}
    for one in runs:
        series = metrics.parse(metrics.render("mail", metrics.record(series, unit, one, interval, timeout)))
    return series


def test_a_success_then_failures_count_by_result_and_in_a_row():
    series = series_after(run("success", ended=1002.5), run("exit-code", 3, 1010.0, 1011.0),
                          run("signal", 128 + 11, 1020.0, 1020.25))
    assert series[("runs_total", UNIT, "success")] == 1
    assert series[("runs_total", UNIT, "exit-code")] == 1
    assert series[("runs_total", UNIT, "signal")] == 1
    assert series[("consecutive_failures", UNIT, "")] == 2
    assert series[("last_run_success", UNIT, "")] == 0
    assert series[("last_exit_status", UNIT, "")] == 139
    assert series[("last_success_timestamp_seconds", UNIT, "")] == 1002.5
    assert series[("last_run_duration_seconds", UNIT, "")] == 0.25


def test_a_backlog_batch_is_a_success_and_resets_the_failures():
    series = series_after(run("timeout", 143), run("backlog", 75, 2000.0, 2000.5))
    assert series[("consecutive_failures", UNIT, "")] == 0
    assert series[("last_run_success", UNIT, "")] == 1
    assert series[("last_success_timestamp_seconds", UNIT, "")] == 2000.5
    assert series[("runs_total", UNIT, "backlog")] == 1


def test_no_success_yet_writes_no_success_timestamp():
    assert ("last_success_timestamp_seconds", UNIT, "") not in series_after(run("exit-code", 1))


def test_instances_keep_their_own_series_in_one_file():
    series = {}
    for unit, result in (("batchq-mail@1.service", "success"), ("batchq-mail@2.service", "exit-code"),
                         ("batchq-mail@1.service", "success")):
        series = metrics.parse(metrics.render("mail", metrics.record(series, unit, run(result), 60.0, 0)))
    assert series[("runs_total", "batchq-mail@1.service", "success")] == 2
    assert series[("runs_total", "batchq-mail@2.service", "exit-code")] == 1
    assert series[("timeout_seconds", "batchq-mail@2.service", "")] == float("inf")


def test_the_file_has_help_and_type_once_and_no_timestamps():
    text = metrics.render("mail", metrics.record({}, UNIT, run("success"), 1.5, 3.0))
    lines = text.splitlines()
    assert lines.count("# TYPE batchq_consumer_runs_total counter") == 1
    assert 'batchq_consumer_runs_total{consumer="mail",unit="batchq-mail.service",result="success"} 1' in lines
    assert 'batchq_consumer_interval_seconds{consumer="mail",unit="batchq-mail.service"} 1.5' in lines
    # a sample line is name{labels} value: no third field (a timestamp)
    assert all(len(line.split("} ")[1].split()) == 1 for line in lines if not line.startswith("#"))


def test_lines_of_other_writers_and_garbage_are_ignored():
    text = 'other_metric{unit="x"} 5\nbatchq_consumer_runs_total{consumer="m",unit="u",result="success"} oops\n'
    assert metrics.parse(text) == {}


def test_update_replaces_the_file_atomically_readable_by_others(tmp_path):
    metrics.update(str(tmp_path), "mail", UNIT, run("success"), 60.0, 3600.0)
    metrics.update(str(tmp_path), "mail", UNIT, run("success"), 60.0, 3600.0)
    assert sorted(os.listdir(tmp_path)) == ["metrics.prom"]
    assert os.stat(tmp_path / "metrics.prom").st_mode & 0o777 == 0o644
    assert metrics.parse((tmp_path / "metrics.prom").read_text())[("runs_total", UNIT, "success")] == 2


def test_a_link_the_consumer_planted_at_the_temporary_name_is_replaced_never_followed(tmp_path):
    # The folder is the consumer's user's; the writer after a run is root.
    folder, precious = tmp_path / "metrics", tmp_path / "precious"
    folder.mkdir()
    precious.write_text("keep me")
    os.symlink(precious, folder / ".metrics.prom.tmp")
    metrics.update(str(folder), "mail", UNIT, run("success"), 60.0, 3600.0)
    assert precious.read_text() == "keep me"
    assert sorted(os.listdir(folder)) == ["metrics.prom"]
    assert metrics.parse((folder / "metrics.prom").read_text())[("runs_total", UNIT, "success")] == 1


def test_every_counter_a_rule_may_watch_is_there_from_the_first_batch_at_0():
    series = metrics.record({}, UNIT, run("success"), 60.0, 0)
    assert {key[2]: value for key, value in series.items() if key[0] == "runs_total"} == {
        "success": 1, "exit-code": 0, "signal": 0, "timeout": 0}


def test_the_series_of_units_the_consumer_no_longer_has_are_dropped():
    series = {}
    for unit in ("batchq-mail@1.service", "batchq-mail@2.service", "batchq-mail@3.service"):
        series = metrics.record(series, unit, run("success"), 60.0, 0)
    # instances 3 -> 2
    kept = ("batchq-mail@1.service", "batchq-mail@2.service")
    series = metrics.record(series, "batchq-mail@1.service", run("exit-code"), 60.0, 0, kept)
    assert {key[1] for key in series} == set(kept)
    assert series[("runs_total", "batchq-mail@2.service", "success")] == 1
    # no list: nothing is dropped
    assert {key[1] for key in metrics.record(series, "batchq-mail@9.service", run("success"), 60.0, 0)} == {
        "batchq-mail@1.service", "batchq-mail@2.service", "batchq-mail@9.service"}
