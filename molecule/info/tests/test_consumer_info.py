"""consumer_info against the truth: systemctl show and the consumers' own records."""

import json
import re
import subprocess
import time

import pytest

from testlib import (
    INVENTORY,
    ansible_module,
    consumer_info,
    deploy,
    figure,
    finished,
    journal,
    memory_kill_result,
    next_elapse,
    runs,
    show,
    side_by_side,
    timestamp,
    timestamp_of,
    wait_for,
)

RUNS = 3  # runs the test starts of each consumer
FINISHED = ["ok", "exit3", "killed", "hung", "hog"]


@pytest.fixture(scope="module")
def driven(hosts):
    """Start RUNS runs of every finishing consumer, one after another on each
    host, the hosts side by side. Returns when each run was asked for and
    when systemctl answered: {host: {consumer: [(asked, answered), ...]}},
    seconds since the epoch (the hosts share this machine's clock)."""
    windows = {host.backend.get_hostname(): {name: [] for name in FINISHED} for host in hosts}

    def drive(host):
        for name in FINISHED:
            for dummy in range(RUNS):
                asked = time.time()
                # waits for the start job to end: after the run's ExecStopPost=
                host.run("systemctl start batchq-%s.service", name)
                windows[host.backend.get_hostname()][name].append((asked, time.time()))
    side_by_side(drive, hosts)
    return windows


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
    # The report's times are systemd's: they match systemd's own record of
    # the run. The consumer's records come after its process started and
    # before it ended; Python took over a second to start on a loaded CI machine.
    started, finished = timestamp_of(last["started"]), timestamp_of(last["finished"])
    assert abs(started - timestamp(truth["ExecMainStartTimestamp"])) < 1.0, explain
    assert abs(finished - timestamp(truth["ExecMainExitTimestamp"])) < 1.0, explain
    assert started <= own[-1]["start"] < started + 10.0, explain
    if "end" in own[-1]:
        assert own[-1]["end"] <= finished < own[-1]["end"] + 10.0, explain
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
    # cgroup v1 reports a memory kill as a signal, v2 as oom-kill: this host's
    assert consumers["hog"]["last_run"]["result"] == memory_kill_result(host), consumers["hog"]


def test_each_run_and_the_mean_duration_lie_between_the_probe_own_time_and_systemctl_start(host, driven):
    """A run of ok, as reported, holds the probe's own run (its records around
    its 0.3 s of sleep) and lies inside the call of systemctl start that asked
    for it: systemd starts the run once asked, and ends the start job, after
    ExecStopPost=, before systemctl answers. So the mean duration lies between
    the probe's mean and the mean of those calls, whatever the machine's load."""
    report = consumer_info(host, history=20)["consumers"]["ok"]
    own = {run["invocation"]: run for run in finished(runs(host, "ok"))}
    windows = driven[host.backend.get_hostname()]["ok"]
    assert len(report["history"]) == len(own) == len(windows) == RUNS, (report, own, windows)
    for run in report["history"]:
        mine = own[run["invocation_id"]]
        (asked, answered), = [window for window in windows if window[0] <= mine["start"] <= window[1]]
        started, ended_at = timestamp_of(run["started"]), timestamp_of(run["finished"])
        assert asked <= started <= mine["start"] and mine["end"] <= ended_at <= answered, (run, mine, asked, answered)
        assert abs(run["duration_s"] - (ended_at - started)) <= 0.001, run
    probe = sum(run["end"] - run["start"] for run in own.values()) / RUNS
    calls = sum(answered - asked for asked, answered in windows) / RUNS
    # each duration and the mean are rounded to the millisecond
    mean = report["summary"]["mean_duration_s"]
    assert probe - 0.001 <= mean <= calls + 0.001, (report["summary"], probe, calls)
    assert report["summary"]["success_rate"] == 1.0
    figure("%s: ok's mean run %.3f s, between the probe's %.3f s and systemctl start's %.3f s"
           % (host.backend.get_hostname(), mean, probe, calls))


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
    # start_delay is 1h: each instance's timer is enabled and its start scheduled
    assert all(c["timer"]["enabled"] and c["state"] == "waiting" and c["timer"]["next_run"]
               for c in consumers.values()), consumers


def ended(host, unit):
    """Whether a run of the unit has ended: its main process exited, and its
    ExecStopPost= writer after it (the unit is "deactivating" until then)."""
    state = show(host, unit, "ActiveState", "ExecMainExitTimestampMonotonic")
    return state["ActiveState"] in ("inactive", "failed") and state["ExecMainExitTimestampMonotonic"] not in ("", "0")


def test_running_batch_is_reported_running_since_its_start(host):
    host.check_output("rm -f /var/lib/batchq/busy/release && systemctl start --no-block batchq-busy.service")
    try:
        started = wait_for(lambda: [r for r in runs(host, "busy") if "end" not in r], 30, "busy to start")[-1]
        report = consumer_info(host)["consumers"]["busy"]
        assert report["state"] == "running", report
        # systemd's start of the run, then the consumer's first record (above)
        since = timestamp_of(report["running_since"])
        assert since <= started["start"] < since + 10.0, (report, started)
    finally:
        host.run("touch /var/lib/batchq/busy/release")
    # the probe's end, then systemd's
    wait_for(lambda: finished(runs(host, "busy")), 30, "busy to end")
    wait_for(lambda: ended(host, "batchq-busy.service"), 30, "systemd to end busy's run")
    report = consumer_info(host)["consumers"]["busy"]
    assert report["state"] == "waiting" and report["last_run"]["result"] == "success", report


def test_next_run_is_when_systemd_says(host):
    report = consumer_info(host)["consumers"]["ok"]
    # until start_delay (1h) has passed since the deploy, the starter timer holds the next run
    armed = "batchq-ok.timer" if report["timer"]["active"] else "batchq-ok.start.timer"
    next_run = next_elapse(host, armed)
    assert abs(timestamp_of(report["timer"]["next_run"]) - next_run) <= 1.0, (report["timer"], armed)


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


def test_each_instance_of_a_paused_consumer_is_paused_not_missing(host):
    # systemd has let go of its stopped and disabled instances: only the templates are left
    wait_for(lambda: host.check_output("systemctl list-units --all --no-legend --plain 'batchq-quiet*'") == "",
             30, "systemd to let go of quiet's instances")
    report = consumer_info(host)["consumers"]
    assert sorted(key for key in report if key.startswith("quiet")) == ["quiet@1", "quiet@2"], sorted(report)
    for key in ("quiet@1", "quiet@2"):
        assert report[key]["state"] == "paused", report[key]
        assert report[key]["timer"]["enabled"] is False and report[key]["timer"]["active"] is False, report[key]
    assert sorted(consumer_info(host, names="quiet")["consumers"]) == ["quiet@1", "quiet@2"]


def test_timer_stopped_by_hand_is_stopped_until_a_starter_arms_it(host):
    # the timer and the start the deploy scheduled (start_delay 1h)
    host.check_output("systemctl stop batchq-halted.timer 'batchq-halted.start.time[r]'")
    try:
        report = consumer_info(host)["consumers"]["halted"]
        assert report["state"] == "stopped", report
        assert report["timer"]["enabled"] is True and report["timer"]["next_run"] is None, report

        # the role's starter timer (consumer_names.starter_unit) will start it: waiting, not stopped
        host.check_output("systemd-run --quiet --unit=batchq-halted.start --on-active=30s "
                          "--timer-property=RemainAfterElapse=no --collect "
                          "/bin/systemctl start --no-block batchq-halted.timer")
        report = consumer_info(host)["consumers"]["halted"]
        assert report["state"] == "waiting", report
        assert abs(timestamp_of(report["timer"]["next_run"]) - next_elapse(host, "batchq-halted.start.timer")) <= 1.0
        assert "halted.start" not in " ".join(consumer_info(host)["consumers"]), "the starter taken for a consumer"
        host.check_output("systemctl stop batchq-halted.start.timer")
        assert consumer_info(host)["consumers"]["halted"]["state"] == "stopped"
    finally:
        host.run("systemctl stop batchq-halted.start.timer")
        host.check_output("systemctl start batchq-halted.timer")
    assert consumer_info(host)["consumers"]["halted"]["state"] == "waiting"


def test_stopped_timer_fails_the_status_checks_and_paused_ones_do_not(hosts):
    for host in hosts:
        # the start the deploy scheduled is gone once an earlier test stopped it: a glob may match nothing
        host.check_output("systemctl start batchq-halted.service && "
                          "systemctl stop batchq-halted.timer 'batchq-halted.start.time[r]'")
    try:
        failing = status_playbook("-e", "consumer_status_fail_on_failed=true")
        overdue = status_playbook("-e", "consumer_status_max_age=3600")
    finally:
        for host in hosts:
            host.check_output("systemctl start batchq-halted.timer")
    for host in hosts:
        name = host.backend.get_hostname()
        assert re.search(r"%s\s+halted\s+stopped\s+success" % name, failing.output), failing.output
        assert "halted on %s: stopped" % name in failing.output, failing.output
        # its last run ended seconds ago, yet nothing will start the next: max_age must still see it
        assert "halted on %s: no run ended" % name not in overdue.output, overdue.output
        assert "never on %s" % name not in failing.output + overdue.output
        assert "quiet@1 on %s" % name not in failing.output + overdue.output
    assert failing.returncode != 0


def test_stopped_timer_is_not_exempt_from_max_age(hosts):
    host = hosts[0]
    name = host.backend.get_hostname()
    host.check_output("systemctl stop batchq-halted.timer")
    try:
        overdue = status_playbook("-e", "consumer_status_max_age=1", "-e", "consumer_hosts=%s" % name)
    finally:
        host.check_output("systemctl start batchq-halted.timer")
    assert overdue.returncode != 0 and "halted on %s: no run ended in the last 1s" % name in overdue.output, \
        overdue.output
    assert "never on %s" % name not in overdue.output and "quiet@1 on %s" % name not in overdue.output


def test_start_that_fails_before_exec_is_reported_alone(host):
    host.check_output("systemctl start batchq-envfile.service")
    good = wait_for(lambda: finished(runs(host, "envfile")), 30, "a run of envfile")[-1]
    host.check_output("mv /etc/batchq-test/envfile.env /etc/batchq-test/envfile.away")
    try:
        failed = host.run("systemctl start batchq-envfile.service")
        assert failed.rc != 0, failed.stdout
        truth = show(host, "batchq-envfile.service", "InvocationID", "Result", "StateChangeTimestamp")
        report = consumer_info(host, history=5, log_lines=5)["consumers"]["envfile"]
    finally:
        host.check_output("mv /etc/batchq-test/envfile.away /etc/batchq-test/envfile.env")
    explain = "%s%s" % (report, journal(host, "envfile"))
    last = report["last_run"]
    assert last is not None, explain
    # the role's units check their environment file in ExecStartPre= (systemd
    # itself would fail the run with result "resources" and say nothing more)
    assert truth["Result"] == "exit-code", explain
    assert last["invocation_id"] == truth["InvocationID"] != good["invocation"], explain
    # systemd: "Control process exited, code=exited, status=1/FAILURE"
    assert (last["result"], last["exit_code"], last["exit_status"]) == ("exit-code", "exited", 1), explain
    assert last["log"] == ["batchq: environment file /etc/batchq-test/envfile.env is missing; this run fails"], explain
    # nothing of the run before: it ended when systemd gave up, not when the probe ended
    assert abs(timestamp_of(last["finished"]) - timestamp(truth["StateChangeTimestamp"])) < 1.0, explain
    assert last["started"] is None or timestamp_of(last["started"]) > good["end"], explain
    assert report["state"] == "failed", explain
    assert [r["invocation_id"] for r in report["history"][:2]] == [truth["InvocationID"], good["invocation"]], explain
    assert not any(good["invocation"] in line for line in last["log"]), explain


ROOT_PASSWORD = "batchq-test-only"


@pytest.fixture(scope="module")
def tester(hosts):
    """An unprivileged account on every host that can escalate with su and the root password."""
    for host in hosts:
        host.check_output("id tester || useradd --create-home tester")
        host.check_output("echo root:%s | chpasswd" % ROOT_PASSWORD)
    return ["-e", "ansible_user=tester", "-e", "ansible_become_method=su",
            "-e", "ansible_become_password=" + ROOT_PASSWORD]


def test_consumer_info_without_root_says_it_cannot_read_the_journal(host, tester):
    rc, output = ansible_module(host, "batchq.consumers.consumer_info", "", "-e", "ansible_user=tester")
    assert rc != 0 and "tester, who cannot read the system journal" in output, output
    host.check_output("usermod -aG systemd-journal tester")
    try:
        rc, output = ansible_module(host, "batchq.consumers.consumer_info", "names=ok", "-e", "ansible_user=tester")
    finally:
        host.check_output("gpasswd -d tester systemd-journal")
    # a member of systemd-journal reads the same runs as root
    truth = show(host, "batchq-ok.service", "InvocationID")["InvocationID"]
    assert rc == 0 and truth and truth in output, output


def test_status_playbook_escalates_for_a_user_connecting_as_themselves(hosts, driven, tester):
    table = status_playbook(*tester)
    assert table.returncode == 0, table.output
    for host in hosts:
        assert re.search(r"%s\s+exit3\s+failed\s+exit-code" % host.backend.get_hostname(), table.output), table.output


def test_custom_prefix_and_host_patterns(hosts, tester):
    # deployed by a user who escalates, with another prefix: the batchq- consumers stay as they are
    deployed = deploy([{"name": "alt", "command": "/usr/local/bin/batchq-probe run --exit 3"}],
                      consumer_unit_prefix="other-", **dict(arg.split("=", 1) for arg in tester[1::2]))
    assert deployed.returncode == 0, deployed.output
    for host in hosts:
        assert host.run("systemctl start other-alt.service").rc != 0
    names = [host.backend.get_hostname() for host in hosts]

    failing = status_playbook("-e", "consumer_unit_prefix=other-", "-e", "consumer_hosts=*debian1*",
                              "-e", "consumer_status_fail_on_failed=true")
    assert failing.returncode != 0, failing.output
    for name in names:
        assert re.search(r"%s\s+alt\s+failed\s+exit-code" % name, failing.output), failing.output
        assert "alt on %s: failed" % name in failing.output, failing.output
    for name in names:  # the batchq- consumers are not theirs
        assert not re.search(r"%s\s+(ok|exit3|never)\s" % name, failing.output), failing.output

    one = status_playbook("-e", "consumer_hosts=consumers:&*debian13")
    assert one.returncode == 0, one.output
    shown = {name for name in names if re.search(r"%s\s+ok\s+" % name, one.output)}
    assert shown == {name for name in names if name.endswith("debian13")}, one.output


SUDOER_PASSWORD = "sudoer-test-only"


@pytest.fixture(scope="module")
def sudoer(hosts):
    """An account that escalates with sudo and its own password, as on most fleets (the
    image's sudoers grants the sudo group everything, with a password)."""
    for host in hosts:
        host.check_output("id sudoer || useradd --create-home --groups sudo sudoer")
        host.check_output("echo sudoer:%s | chpasswd" % SUDOER_PASSWORD)
    return {"ansible_user": "sudoer", "ansible_become_method": "sudo", "ansible_become_password": SUDOER_PASSWORD}


def test_deploy_and_status_escalate_with_sudo(hosts, sudoer):
    for host in hosts:  # sudo asks sudoer for a password: nothing is let through without one
        assert host.run("su sudoer -c 'sudo -n true'").rc != 0
    deployed = deploy([{"name": "probe", "command": "/usr/local/bin/batchq-probe run", "start_delay": "1s"}],
                      consumer_unit_prefix="viasudo-", **sudoer)
    assert deployed.returncode == 0, deployed.output
    for host in hosts:
        unit = host.file("/etc/systemd/system/viasudo-probe.service")
        assert unit.exists and unit.user == "root", deployed.output
        wait_for(lambda h=host: ended(h, "viasudo-probe.service"), 60, "the first run of viasudo-probe")
    table = status_playbook("-e", "consumer_unit_prefix=viasudo-", *("-e%s=%s" % item for item in sudoer.items()))
    assert table.returncode == 0, table.output
    for host in hosts:
        assert re.search(r"%s\s+probe\s+\w+\s+success" % host.backend.get_hostname(), table.output), table.output
