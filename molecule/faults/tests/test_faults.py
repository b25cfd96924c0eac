"""One bad batch affects only itself: crash storms, hangs, leaks, failures and
fork bombs, each beside a healthy consumer, judged from the consumers' own
records and systemd's. Figures are printed as FIGURE lines."""

from testlib import (consumer_spec, exits, figure, finished, journal, memory_kill_result, runs, scenario_vars,
                     timestamp_of, wait_for, watched_since)

# The consumers whose timers run during these tests (conftest.py): the others wait.
WATCHES = ("healthy", "crasher", "hang", "stubborn", "leak", "exit3", "forker")

WINDOW = 60.0  # seconds of crash storm compared with a healthy consumer
# The manager arms a run's timeout, spawns its first process, and only then
# logs the run's start. On a loaded host the spawn (systemd-executor since 255)
# can take most of a second, so a run seems to end up to that much before
# its timeout, counted from the logged start.
START_LOGGED_LATE = 1.0


def consumer_info(host, name, history=20):
    result = host.ansible("batchq.consumers.consumer_info", "names=%s history=%d log_lines=5" % (name, history),
                          check=False)
    assert result.get("failed") is not True, result
    return result["consumers"][name]


def starts(host, name):
    return [r["start"] for r in runs(host, name)]


def seconds(name, field):
    """A time span of the scenario's consumer, or of its defaults, in seconds ("3s" -> 3.0)."""
    spec = dict(scenario_vars()["consumer_defaults"], **consumer_spec(name))
    return float(spec[field].rstrip("s"))


def kill_delays(host, name, history):
    """Seconds from each run's start to the exit of its main process, by the
    manager's clock, for the runs whose consumer had begun (the probe wrote its
    start): on a loaded machine a run can reach its timeout before its program
    has started, and then shows nothing of how the program is stopped."""
    exited = exits(host, "batchq-%s.service" % name)
    began = {r["invocation"] for r in runs(host, name)}
    return [exited[r["invocation_id"]] - timestamp_of(r["started"]) for r in history
            if r["invocation_id"] in exited and r["invocation_id"] in began]


def test_hung_batch_is_killed_at_its_timeout_and_the_next_follows(host):
    timeout, interval = seconds("hang", "timeout"), seconds("hang", "interval")
    since = watched_since()

    def ended_runs():
        # the runs since hang's timer runs for this module, by systemd's start:
        # the probe records its start later (Python starts in up to a second
        # on a loaded machine), so its count would include a run begun before
        report = consumer_info(host, "hang")
        history = [r for r in reversed(report["history"]) if timestamp_of(r["started"] or r["finished"]) > since]
        return len(history) >= 3 and (report, history)

    # the probe's records first: they cost a `cat`, a report costs a module run
    wait_for(lambda: len([r for r in runs(host, "hang") if r["start"] > since]) >= 4, 60, "four starts of hang")
    report, history = wait_for(ended_runs, 30, "three ended runs of hang", interval=1)
    assert all(r["result"] == "timeout" for r in history), report
    kill_times = kill_delays(host, "hang", history)
    # from the manager's own stamps: its start of the run, its record of the exit
    assert len(kill_times) >= 2 and all(timeout - START_LOGGED_LATE <= t <= timeout + 2.5 for t in kill_times), (
        kill_times, journal(host, "hang"))
    # a run ends after its ExecStopPost= writer: never before its timeout
    assert all(r["duration_s"] >= timeout - START_LOGGED_LATE for r in history), report
    # by the manager's stamps: the probe of a run may not get to record its start
    # within a timeout of 3 s on a loaded machine, and the next record would be a run later
    starts = [timestamp_of(r["started"]) for r in history if r["started"]]
    gaps = []
    for previous in history:
        later = [t for t in starts if t > timestamp_of(previous["finished"])]
        if later:
            gaps.append(min(later) - timestamp_of(previous["finished"]))
    # the interval, its accuracy and the manager's own pace on a loaded machine
    assert gaps and all(g <= interval + 0.1 + 3.0 for g in gaps), gaps
    figure("%s hang: killed after %.2f-%.2fs (timeout %gs), next run %.2f-%.2fs later (interval %gs)" % (
        host.backend.get_hostname(), min(kill_times), max(kill_times), timeout, min(gaps), max(gaps), interval))


def test_a_batch_that_ignores_sigterm_is_killed_stop_timeout_after_its_timeout(host):
    timeout, stop_timeout = seconds("stubborn", "timeout"), seconds("stubborn", "stop_timeout")
    # without TimeoutStopSec= the first batch alone would take timeout + 90s
    wait_for(lambda: len(runs(host, "stubborn")) >= 3, 90, "three starts of stubborn")
    history = consumer_info(host, "stubborn")["history"]
    began = {r["invocation"] for r in runs(host, "stubborn")}
    ignored = [r for r in history if r["invocation_id"] in began]
    assert len(ignored) >= 2, history
    # killed by SIGKILL, not by the SIGTERM it ignored; recorded as a timeout
    assert all((r["result"], r["exit_code"], r["exit_status"]) == ("timeout", "killed", "KILL")
               for r in ignored), history
    kill_times = kill_delays(host, "stubborn", ignored)
    expected = timeout + stop_timeout
    # well after the timeout alone (2 s), and far from systemd's default stop
    # timeout (90 s): the run's start is the manager's record of it, which may
    # come a little after the timeout began to count; a loaded manager kills late
    assert len(kill_times) >= 2 and all(expected - START_LOGGED_LATE <= t <= expected + 4.0 for t in kill_times), (
        sorted(kill_times), journal(host, "stubborn"))
    figure("%s SIGTERM ignored: SIGKILL after %.2f-%.2fs (timeout %gs + stop_timeout %gs)" % (
        host.backend.get_hostname(), min(kill_times), max(kill_times), timeout, stop_timeout))


def test_memory_leak_is_killed_and_the_next_run_follows(host):
    wait_for(lambda: len(runs(host, "leak")) >= 3, 60, "three starts of leak")
    report = consumer_info(host, "leak")
    assert report["summary"]["runs"] >= 2 and report["summary"]["failures"] == report["summary"]["runs"], report
    # cgroup v1 reports the kill as a signal, cgroup v2 as oom-kill: this host's, no other
    assert {r["result"] for r in report["history"]} == {memory_kill_result(host)}, report
    assert all("end" not in r for r in runs(host, "leak")), "a leaking batch finished"
    healthy = consumer_info(host, "healthy")
    assert healthy["summary"]["failures"] == 0 and healthy["state"] in ("waiting", "running"), healthy
    figure("%s leak: %s, %d runs killed, healthy consumer %d/%d runs fine" % (
        host.backend.get_hostname(), report["history"][0]["result"], report["summary"]["runs"],
        healthy["summary"]["runs"] - healthy["summary"]["failures"], healthy["summary"]["runs"]))


def test_exit_status_3_is_recorded_and_runs_go_on(host):
    def three_ended():
        # systemd's count, not the probe's: a run ends for systemd after its
        # ExecStopPost= writer, up to seconds after the probe recorded its end
        report = consumer_info(host, "exit3")
        return report["summary"]["runs"] >= 3 and report

    wait_for(lambda: len(finished(runs(host, "exit3"))) >= 3, 60, "three runs of exit3")
    report = wait_for(three_ended, 30, "three ended runs of exit3", interval=1)
    assert all((r["result"], r["exit_code"], r["exit_status"]) == ("exit-code", "exited", 3)
               for r in report["history"]), report
    assert report["state"] in ("failed", "running") and report["summary"]["runs"] >= 3


def test_fork_bomb_is_capped_and_leaves_no_process_behind(host):
    tasks_max = consumer_spec("forker")["tasks_max"]
    run = wait_for(lambda: [r for r in finished(runs(host, "forker")) if "pids" in r], 60, "a finished forker run")[0]
    assert 0 < len(run["pids"]) < tasks_max and run["refused"] > 0, run
    wait_for(lambda: all(not host.file("/proc/%d" % pid).exists for pid in run["pids"]), 15,
             "the children of a finished batch to be gone%s" % journal(host, "forker"))
    figure("%s fork bomb: %d of 30 children forked under tasks_max %d, %d refused, 0 left after the batch" % (
        host.backend.get_hostname(), len(run["pids"]), tasks_max, run["refused"]))


def test_crash_storm_is_started_as_often_as_a_healthy_consumer(host):
    # last in the module: its window of runs began with the module, and the
    # tests above run while it fills
    since = watched_since()

    def window():
        # from when both run for this module: not across the pause before it
        crashes, healthy = ([t for t in starts(host, name) if t > since] for name in ("crasher", "healthy"))
        begin = max(crashes[0], healthy[0]) if crashes and healthy else None
        return begin is not None and min(crashes[-1], healthy[-1]) >= begin + WINDOW and begin

    begin = wait_for(window, WINDOW + 90, "%ss of runs of crasher and healthy" % WINDOW, interval=2)
    crashes = [t for t in starts(host, "crasher") if begin <= t < begin + WINDOW]
    healthy = [t for t in starts(host, "healthy") if begin <= t < begin + WINDOW]
    ratio = len(crashes) / len(healthy)
    figure("%s crash storm: %d crashing starts vs %d healthy in %ds, ratio %.2f" % (
        host.backend.get_hostname(), len(crashes), len(healthy), WINDOW, ratio))
    assert ratio >= 0.8, journal(host, "crasher")
    last = consumer_info(host, "crasher")["last_run"]
    assert (last["result"], last["exit_status"]) in (("signal", "SEGV"), ("core-dump", "SEGV")), last
