"""consumer_info against the truth: systemctl show and the consumers' own records."""

import json
import re
import subprocess

import pytest

from testlib import INVENTORY, finished, journal, runs, show, timestamp, timestamp_of, wait_for

RUNS = 3  # runs the test starts of each consumer
FINISHED = ["ok", "exit3", "killed", "hung", "hog"]


def consumer_info(host, **options):
    arguments = " ".join("%s=%s" % item for item in options.items())
    result = host.ansible("batchq.consumers.consumer_info", arguments, check=False)
    assert result.get("failed") is not True, result
    return result


@pytest.fixture(scope="module")
def driven(hosts):
    """Start RUNS runs of every finishing consumer on every host, one after another."""
    for host in hosts:
        for name in FINISHED:
            for dummy in range(RUNS):
                host.run("systemctl start batchq-%s.service", name)  # waits for the oneshot to end
    return hosts


@pytest.mark.parametrize("name", FINISHED)
def test_last_run_and_history_match_systemd_and_the_consumer(host, driven, name):
    report = consumer_info(host, history=20, log_lines=50)["consumers"][name]
    truth = show(host, "batchq-%s.service" % name, "InvocationID", "Result", "ExecMainStatus",
                 "ExecMainCode", "ExecMainStartTimestamp", "ExecMainExitTimestamp")
    own = runs(host, name)
    explain = "%s%s" % (report, journal(host, name))
    last = report["last_run"]

    assert last["invocation_id"] == truth["InvocationID"] == own[-1]["invocation"], explain
    assert last["result"] == truth["Result"], explain
    assert report["state"] == ("waiting" if truth["Result"] == "success" else "failed"), explain
    assert abs(timestamp_of(last["started"]) - own[-1]["start"]) < 1.0, explain
    assert abs(timestamp_of(last["finished"]) - timestamp(truth["ExecMainExitTimestamp"])) < 1.0, explain
    if "end" in own[-1]:
        assert abs(timestamp_of(last["finished"]) - own[-1]["end"]) < 1.0, explain
    code = {"1": "exited", "2": "killed", "3": "dumped"}[truth["ExecMainCode"]]
    assert last["exit_code"] == code, explain
    if code == "exited":
        assert last["exit_status"] == int(truth["ExecMainStatus"]), explain

    # the log is that run's own, and all of it
    assert last["log"], explain
    assert all(own[-1]["invocation"] in line for line in last["log"]), explain
    assert any(line.startswith("batchq-probe start") for line in last["log"]), explain

    assert [r["invocation_id"] for r in report["history"]] == [r["invocation"] for r in reversed(own)], explain
    summary = report["summary"]
    assert summary["runs"] == len(own) == RUNS, explain
    assert summary["failures"] == (0 if name == "ok" else RUNS), explain


def test_expected_results_of_each_fault(host, driven):
    consumers = consumer_info(host)["consumers"]
    assert consumers["ok"]["last_run"]["result"] == "success"
    assert (consumers["exit3"]["last_run"]["result"], consumers["exit3"]["last_run"]["exit_status"]) == ("exit-code", 3)
    assert (consumers["killed"]["last_run"]["result"], consumers["killed"]["last_run"]["exit_status"]) == ("signal", "KILL")
    assert consumers["hung"]["last_run"]["result"] == "timeout"
    # cgroup v1 reports a memory kill as a signal, v2 as oom-kill (SYSTEMD_FACTS §6)
    assert consumers["hog"]["last_run"]["result"] in ("oom-kill", "signal"), consumers["hog"]


def test_mean_duration_matches_the_consumer_own_timing(host, driven):
    report = consumer_info(host, history=20)["consumers"]["ok"]
    own = finished(runs(host, "ok"))
    mean = sum(r["end"] - r["start"] for r in own) / len(own)
    assert report["summary"]["mean_duration_s"] == pytest.approx(mean, abs=0.5)
    assert report["summary"]["success_rate"] == 1.0


def test_history_is_cut_to_the_asked_length(host, driven):
    report = consumer_info(host, history=2, log_lines=1)["consumers"]["exit3"]
    own = runs(host, "exit3")
    assert [r["invocation_id"] for r in report["history"]] == [own[-1]["invocation"], own[-2]["invocation"]]
    assert len(report["last_run"]["log"]) == 1
    assert report["summary"]["runs"] == 2


def test_paused_before_first_run_reports_no_run(host):
    report = consumer_info(host)["consumers"]["never"]
    assert report["state"] == "paused"
    assert report["last_run"] is None and report["history"] == []
    assert report["timer"]["enabled"] is False and report["timer"]["active"] is False


def test_named_consumer_that_is_not_installed_is_missing(host):
    assert consumer_info(host, names="ghost,ok")["consumers"]["ghost"]["state"] == "missing"


def test_instances_are_reported_each(host):
    consumers = consumer_info(host, names="pair")["consumers"]
    assert sorted(consumers) == ["pair@1", "pair@2"]
    assert all(c["timer"]["enabled"] and c["timer"]["active"] for c in consumers.values())


def test_running_batch_is_reported_running_since_its_start(host):
    host.check_output("rm -f /var/lib/batchq/busy/release && systemctl start --no-block batchq-busy.service")
    try:
        started = wait_for(lambda: [r for r in runs(host, "busy") if "end" not in r], 30, "busy to start")[-1]
        report = consumer_info(host)["consumers"]["busy"]
        assert report["state"] == "running", report
        assert abs(timestamp_of(report["running_since"]) - started["start"]) < 1.0, report
    finally:
        host.run("touch /var/lib/batchq/busy/release")
    wait_for(lambda: finished(runs(host, "busy")), 30, "busy to end")
    report = consumer_info(host)["consumers"]["busy"]
    assert report["state"] == "waiting" and report["last_run"]["result"] == "success", report


def test_next_run_is_when_systemd_says(host):
    report = consumer_info(host)["consumers"]["ok"]
    listed = host.check_output("systemctl list-timers --all --no-legend batchq-ok.timer").split()
    # NEXT comes first, as 'Sun 2026-11-29 12:58:26 UTC', in the host's zone (UTC)
    next_run = timestamp("%s %s %s.0 UTC" % tuple(listed[:3]))
    assert abs(timestamp_of(report["timer"]["next_run"]) - next_run) <= 1.0, (report["timer"], listed)


def test_fleet_status_table_json_and_monitoring_verdicts(hosts, driven, tmp_path):
    report = tmp_path / "fleet.json"
    table = status_playbook("-e", "consumer_status_json=%s" % report)
    assert table.returncode == 0, table.output
    for host in hosts:
        name = host.backend.get_hostname()
        assert re.search(r"%s\s+exit3\s+failed\s+exit-code\s+\S+ ago\s+[0-9.]+s\s+\S+ \S+\s+3/3" % name, table.output), table.output
        assert re.search(r"%s\s+never\s+paused\s+-\s+never" % name, table.output), table.output
    written = json.loads(report.read_text())
    assert sorted(written) == sorted(h.backend.get_hostname() for h in hosts)
    assert all(written[h]["exit3"]["summary"]["failures"] == RUNS for h in written)

    failing = status_playbook("-e", "consumer_status_fail_on_failed=true")
    assert failing.returncode != 0 and "exit3 on" in failing.output, failing.output
    overdue = status_playbook("-e", "consumer_status_max_age=1")
    assert overdue.returncode != 0 and "no run ended in the last 1s" in overdue.output, overdue.output


def status_playbook(*arguments):
    process = subprocess.run(["ansible-playbook", "batchq.consumers.consumer_status", "-i", INVENTORY, *arguments],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    process.output = process.stdout
    return process
