"""The status playbook's report as set_stats data, which AWX keeps as the
job's artifacts. Outside AWX, the default callback prints that data after the
recap when ANSIBLE_SHOW_CUSTOM_STATS is true: one line, "RUN: " and JSON."""

import json
import os
import re
import subprocess

from testlib import INVENTORY, scenario_vars


def status(*extra):
    """Run the status playbook as a user would, with the custom stats shown;
    returns (returncode, output, the stats of the run or None)."""
    process = subprocess.run(["ansible-playbook", "batchq.consumers.consumer_status", "-i", INVENTORY, *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, check=False,
                             env=dict(os.environ, ANSIBLE_SHOW_CUSTOM_STATS="true"))
    found = re.findall(r"^\s*RUN: (\{.*\})\s*$", process.stdout, re.MULTILINE)
    assert len(found) <= 1, process.stdout
    return process.returncode, process.stdout, json.loads(found[0]) if found else None


def test_the_status_report_is_the_job_artifacts_one_row_per_consumer(host, hosts):
    returncode, output, stats = status()
    assert returncode == 0, output
    report = stats["consumer_status"]
    name = host.backend.get_hostname()
    # the scenario's consumers, as converge deployed them (another test may add its own)
    wanted = {c["name"]: c for c in scenario_vars()["consumer_list"]}
    rows = {row["consumer"]: row for row in report["rows"] if row["host"] == name}
    assert set(wanted) <= set(rows), report
    assert rows["resting"]["state"] == "paused" and rows["resting"]["runs"] == 0, rows["resting"]
    assert rows["resting"]["last_result"] is None and rows["resting"]["last_run_ended"] is None, rows["resting"]
    # steady runs every second: its last run ended within the report's own history
    steady = rows["steady"]
    assert steady["state"] in ("waiting", "running") and steady["last_result"] == "success", steady
    assert steady["failures"] == 0 and steady["runs"] >= 1, steady
    # A timer has no next run from its batch's start until the unit is
    # inactive, after the ExecStopPost= writer: steady, every second, is often
    # in that window ("waiting" already, as its batch ended). A fresh-clone run
    # caught it there on Debian 13.
    assert steady["next_run"] is None or re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+(Z|[+-]\d\d:?\d\d)?",
                                                      steady["next_run"]), steady
    # nothing of the runs' history or output, which could make the artifacts large
    assert set(steady) == {"host", "consumer", "state", "last_result", "last_run_ended", "duration_s",
                           "next_run", "failures", "runs"}, steady
    assert (report["hosts"], report["unanswered"]) == (len(hosts), []), report
    # steady runs and resting is paused: neither is a problem (drain's state is test_compat's doing)
    assert not [problem for problem in report["problems"] if problem.split(" on ")[0] in ("steady", "resting")], report
    assert sum(report["states"].values()) == len(report["rows"]), report


def test_a_failed_check_still_leaves_its_problems_and_problems_alone_has_no_rows(host):
    # drain starts only when a test runs it: it has no run in the last millisecond,
    # and resting is paused, which excuses it.
    returncode, output, stats = status("-e", "consumer_status_max_age=0.001", "-e", "consumer_status_stats=problems")
    assert returncode != 0 and "no run ended in the last 0.001s" in output, output
    report = stats["consumer_status"]
    name = host.backend.get_hostname()
    assert "drain on %s: no run ended in the last 0.001s" % name in report["problems"], report
    assert not [problem for problem in report["problems"] if problem.startswith("resting ")], report
    assert report["rows"] == [] and report["states"]["paused"] >= 1, report


def test_none_gives_no_artifacts_and_a_wrong_choice_is_refused(host):
    returncode, output, stats = status("-e", "consumer_status_stats=none")
    assert returncode == 0 and stats is None, output
    returncode, output, stats = status("-e", "consumer_status_stats=everything")
    assert returncode != 0 and "consumer_status_stats must be table, problems or none, not everything" in output, output
    # refused before any host is asked
    assert "Ask systemd and the journal" not in output and stats is None, output
