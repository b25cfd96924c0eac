"""What every supported ansible-core must run, on one host per release: the
role's modules and the three playbooks as users run them. The role's check
mode, converge and idempotence are the scenario's own steps (molecule.yml).
Everything else is `default`'s, under the oldest and the newest release."""

import json
import re
import subprocess

from testlib import INVENTORY, consumer_info, control, journal, show, wait_for


def playbook(name, *extra):
    """Run one of the collection's playbooks as a user would; returns (returncode, output)."""
    process = subprocess.run(["ansible-playbook", "batchq.consumers." + name, "-i", INVENTORY, *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, check=False)
    return process.returncode, process.stdout


def test_consumer_info_reports_the_runs_of_a_timer_driven_consumer(host):
    def finished_runs():
        report = consumer_info(host, names="steady", history=5)["consumers"]["steady"]
        return len(report["history"]) >= 2 and report

    report = wait_for(finished_runs, 60, "two finished runs of steady", interval=2)
    assert report["state"] in ("waiting", "running") and report["summary"]["failures"] == 0, report
    assert all(run["result"] == "success" and run["exit_status"] == 0 for run in report["history"]), report


def test_control_runs_a_drain_whose_batches_follow_each_other_in_one_run(host):
    returncode, output = control("run", "-e", "consumer_names=drain")
    assert returncode == 0, output
    returncode, output = control("wait", "-e", "consumer_names=drain", "-e", "consumer_wait_timeout=120")
    assert returncode == 0, output
    assert show(host, "batchq-drain.service", "ActiveState", "Result") == {
        "ActiveState": "inactive", "Result": "success"}, journal(host, "drain")
    last = consumer_info(host, names="drain", log_lines=5)["consumers"]["drain"]["last_run"]
    assert (last["batches"], last["last_batch"]["result"], last["log"]) == (5, "success", ["batch 5"]), last
    lines = host.check_output("journalctl --no-pager -o cat -u batchq-drain.service _SYSTEMD_INVOCATION_ID=%s",
                              last["invocation_id"]).splitlines()
    # the batches' own lines, beside the runner's ("batch 1 ended: backlog 75 after 0.001s")
    assert [line for line in lines if re.fullmatch(r"batch \d+", line)] == ["batch %d" % n for n in range(1, 6)], lines


def test_control_pauses_and_resumes_a_timer(host):
    returncode, output = control("pause", "-e", "consumer_names=steady")
    assert returncode == 0, output
    assert show(host, "batchq-steady.timer", "ActiveState") == {"ActiveState": "inactive"}
    returncode, output = control("resume", "-e", "consumer_names=steady")
    assert returncode == 0, output
    wait_for(lambda: show(host, "batchq-steady.timer", "ActiveState") == {"ActiveState": "active"},
             30, "the steady timer to be active again")


def test_status_playbook_shows_each_consumer_and_writes_the_report(host, tmp_path):
    report = tmp_path / "fleet.json"
    returncode, output = playbook("consumer_status", "-e", "consumer_status_json=%s" % report)
    assert returncode == 0, output
    name = host.backend.get_hostname()
    assert re.search(r"%s\s+resting\s+paused\s+-\s+never" % name, output), output
    assert re.search(r"%s\s+steady\s+(waiting|running)\s+success\s" % name, output), output
    written = json.loads(report.read_text())
    assert sorted(written[name]) == ["drain", "resting", "steady"], written


def test_the_first_deploy_made_the_metrics_folder_and_its_parents(host):
    # converge was that deploy, with the role's defaults (consumer_metrics on)
    folders = [host.file("/var/lib/prometheus"), host.file("/var/lib/prometheus/node-exporter")]
    if "bare" in host.ansible.get_variables()["group_names"]:
        # no package made them: the role did, root's, readable by all
        assert not host.package("prometheus-node-exporter").is_installed
        assert not host.exists("sudo")
        assert [(folder.user, folder.mode) for folder in folders] == [("root", 0o755)] * 2
    assert all(folder.is_directory for folder in folders)
    assert host.file("/var/lib/prometheus/node-exporter/batchq-steady.prom").linked_to == \
        "/var/lib/prometheus/node-exporter/batchq-steady.d/metrics.prom"
