"""Failure hooks: a crash storm is one notification per on_failure_every with
the failures it covers, each with its own batch's invocation and log; a hook
that fails or hangs changes nothing for its consumer; a recovery is told once.
Judged from what the hooks wrote down (batchq-hook-record) and the consumers'
own records."""

import json
import time

from testlib import (consumer_series, consumer_spec, exits, finished, journal, on_every_host_at_once, runs, scrape,
                     wait_for)

# The consumers whose timers run during these tests (conftest.py): the others wait.
WATCHES = ("healthy", "crasher", "hang", "exit3", "flaky", "needs-env")

RECORD = "/var/log/batchq-hooks.jsonl"
# "the first failure after a success notifies within a few seconds": well
# under one on a quiet host; 5-6 s seen with a load average of 45 on 2 cores
FEW_SECONDS = 10.0


def span(name):
    return float(consumer_spec(name)["on_failure_every"].rstrip("s"))


def hooks(host, consumer, event="on-failure"):
    out = host.run("cat %s 2>/dev/null || true", RECORD)
    entries = [json.loads(line) for line in out.stdout.splitlines()]
    return [e for e in entries if e["BATCHQ_CONSUMER"] == consumer and e["BATCHQ_EVENT"] == event]


def test_a_crash_storm_notifies_once_per_period_with_the_failures_it_covers(host):
    every = span("crasher")
    wait_for(lambda: len(hooks(host, "crasher")) >= 3, 4 * every + 60, "three notifications about crasher")
    notes = hooks(host, "crasher")
    crash_runs = runs(host, "crasher")
    crashes = [run["invocation"] for run in crash_runs]
    positions = [crashes.index(note["BATCHQ_INVOCATION_ID"]) for note in notes]
    counts = [int(note["BATCHQ_FAILURES"]) for note in notes]
    # crasher never succeeds: its first crash is told at once, alone; each
    # later notification covers the crashes since the one told before
    assert (positions[0], counts[0]) == (0, 1), (positions, counts)
    assert counts[1:] == [b - a for a, b in zip(positions, positions[1:])], (positions, counts)
    # a storm: fewer notifications than crashes (one per period, not per crash)
    assert len(counts) < sum(counts), counts
    # each told crash is the first to end every seconds after the one told
    # before: the period runs between the crashes' ends as systemd recorded
    # them ("Main process exited", by invocation)
    ends = exits(host, "batchq-crasher.service")
    for before, told in zip(positions, positions[1:]):
        first, last, previous = (ends[crashes[i]] for i in (before, told, told - 1))
        assert last - first >= every - 0.1, (first, last)
        assert previous - first < every + 0.1, (first, previous)
    for note in notes:
        assert note["argv"] == ["crasher"]
        assert (note["BATCHQ_UNIT"], note["BATCHQ_RESULT"]) in (
            ("batchq-crasher.service", "signal"), ("batchq-crasher.service", "core-dump")), note
        assert (note["BATCHQ_EXIT_CODE"], note["BATCHQ_EXIT_STATUS"]) in (("killed", "SEGV"), ("dumped", "SEGV")), note
        # the batch's own lines (the probe prints its invocation), no other batch's
        assert note["BATCHQ_INVOCATION_ID"] in note["BATCHQ_LOG"], note
        assert not [other for other in crashes if other != note["BATCHQ_INVOCATION_ID"] and other in note["BATCHQ_LOG"]]


@on_every_host_at_once
def test_a_hook_that_fails_or_hangs_changes_nothing_for_its_consumer(host):
    """exit3's hook sleeps for ever and is stopped after on_failure_every; hang's
    hook fails at once. Both consumers go on at their own pace, with their own
    results, while a hook of exit3 is always running or just stopped."""
    since = time.time()
    wait_for(lambda: len([r for r in runs(host, "exit3") if r["start"] > since]) >= 6, 120, "six runs of exit3")
    # the same interval after each run as healthy: a hook in the way would slow
    # exit3 down. Both are counted from exit3's first start to its sixth.
    exit3 = [r for r in runs(host, "exit3") if r["start"] > since][:6]
    healthy = [r for r in runs(host, "healthy") if exit3[0]["start"] <= r["start"] <= exit3[-1]["start"]]
    assert len(exit3) >= 0.8 * len(healthy), (len(exit3), len(healthy))
    assert all(r["status"] == 3 for r in finished(runs(host, "exit3")))
    every = span("exit3")
    # each wait fails the test when what it waits for never comes
    wait_for(lambda: [line for line in host.run(
        "journalctl --no-pager -o cat -u 'batchq-exit3.on-failure.*' --since=@%s", str(int(since))).stdout.splitlines()
        if "Failed with result 'timeout'" in line], every + 30, "a hanging hook of exit3 to be stopped")
    wait_for(lambda: [line for line in host.run(
        "journalctl --no-pager -o cat -u 'batchq-hang.on-failure.*'").stdout.splitlines()
        if "Failed with result 'exit-code'" in line], 30, "a failed hook of hang")
    # hang times out every 3 s, then waits its interval, its hook failing each time: it goes on
    wait_for(lambda: [r for r in runs(host, "hang") if r["start"] > since][2:], 60,
             "three runs of hang%s" % journal(host, "hang"))


@on_every_host_at_once
def test_the_first_failure_after_a_success_is_told_at_once_and_the_recovery_once(host):
    wait_for(lambda: len(finished(runs(host, "flaky"))) >= 2, 60, "two runs of flaky")
    told, recovered = len(hooks(host, "flaky")), len(hooks(host, "flaky", "on-recovery"))
    since = time.time()
    host.check_output("touch /etc/batchq-test/fail")
    try:
        note = wait_for(lambda: hooks(host, "flaky")[told:], 30, "a notification about flaky")[0]
        failed = {r["invocation"]: r for r in runs(host, "flaky")}[note["BATCHQ_INVOCATION_ID"]]
        assert failed["status"] == 3 and note["BATCHQ_FAILURES"] == "1", note
        assert note["time"] - failed["end"] <= FEW_SECONDS, (note, failed)
        wait_for(lambda: len([r for r in finished(runs(host, "flaky")) if r["status"] == 3 and r["start"] > since]) >= 4,
                 60, "four failures of flaky")
    finally:
        host.check_output("rm -f /etc/batchq-test/fail")
    recovery = wait_for(lambda: hooks(host, "flaky", "on-recovery")[recovered:], 30, "the recovery of flaky")[0]
    failures = [r for r in finished(runs(host, "flaky")) if r["status"] == 3 and r["start"] > since]
    assert recovery["BATCHQ_FAILURES"] == str(len(failures)), (recovery, len(failures))
    assert recovery["BATCHQ_RESULT"] == "success" and recovery["BATCHQ_UNIT"] == "batchq-flaky.service"
    healthy_again = wait_for(lambda: [r for r in finished(runs(host, "flaky")) if r["start"] > recovery["time"]][2:],
                             30, "three more runs of flaky")
    assert healthy_again and all(r["status"] == 0 for r in healthy_again)
    # one notification for the whole episode (on_failure_every 1h), one recovery
    assert (len(hooks(host, "flaky")) - told, len(hooks(host, "flaky", "on-recovery")) - recovered) == (1, 1)


@on_every_host_at_once
def test_a_run_whose_environment_file_is_gone_is_counted_and_told(host):
    """systemd fails such a run before any command, ExecStopPost= included
    (result "resources"): the role makes the file optional to systemd and fails
    the run in an ExecStartPre= that says which file is missing."""
    told = len(hooks(host, "needs-env"))
    failures_before = dict(consumer_series(scrape(host), "needs-env", "runs_total"))
    host.check_output("mv /etc/batchq-test/needs-env.env /etc/batchq-test/needs-env.env.away")
    try:
        note = wait_for(lambda: hooks(host, "needs-env")[told:], 60, "a notification about needs-env")[0]
        # the consumer's command never ran: no exit code or status of its own
        assert (note["BATCHQ_RESULT"], note["BATCHQ_EXIT_CODE"], note["BATCHQ_EXIT_STATUS"]) == (
            "exit-code", "", ""), note
        assert "environment file /etc/batchq-test/needs-env.env is missing" in note["BATCHQ_LOG"], note
        wait_for(lambda: consumer_series(scrape(host), "needs-env", "runs_total").get(
            ("batchq-needs-env.service", "exit-code"), 0) > failures_before.get(
                ("batchq-needs-env.service", "exit-code"), 0), 30, "the failed runs of needs-env in its metrics")
        # the failed run never started the probe: it fails before the consumer's command
        # (a run already past ExecStartPre= when the file went away may still have)
        assert note["BATCHQ_INVOCATION_ID"] not in {r["invocation"] for r in runs(host, "needs-env")}, (
            note, journal(host, "needs-env"))
    finally:
        host.check_output("mv /etc/batchq-test/needs-env.env.away /etc/batchq-test/needs-env.env")
    wait_for(lambda: hooks(host, "needs-env", "on-recovery"), 60, "the recovery of needs-env")
