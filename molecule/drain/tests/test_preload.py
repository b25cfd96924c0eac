"""A preloaded Python consumer: its runner imports the slow module once per run
and forks every batch from there, and each batch still runs as `python3
SCRIPT` would, alone: what one batch does to the module, its memory or its
process reaches no other. Judged from the records each batch writes
(files/preloaded/consume.py), systemd and the journal."""

import json
import time

import pytest

from testlib import journal, memory_kill_result, on_every_host_at_once, show, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()

MARGIN = 3.0  # seconds of slack for a loaded CI machine
SCRIPT = "/opt/batchq-preloaded/consume.py"
FOLDER = "/opt/batchq-preloaded"
IMPORT_SECONDS = 1.0  # heavy.py's import
CODE_CHECK_SECONDS = 1.0  # how often the runner looks for changed files (batchq-drain)
# The runner re-executes itself to import changed code: a Python start, a
# second or more on a loaded machine.
RESTART_SECONDS = 2.0
UNIT = "batchq-%s.service"


def records(host, name, batch_records=True):
    """The batches' records of a consumer's last run, by batch: {number: {event: record}};
    with batch_records=False, the records of the runner's own exit (the preload's atexit handler)."""
    out = host.run("cat /var/lib/batchq/%s/batches.jsonl 2>/dev/null || true", name).stdout
    found = {}
    for line in out.splitlines():
        record = json.loads(line)
        found.setdefault(record["batch"], {})[record["event"]] = record
    runner = found.pop("runner", {})
    return found if batch_records else runner


def set_plan(host, name, plan):
    """Give the consumer's batches plan ({batch: action, "default": action}).
    The file is written aside, then renamed: a batch that reads it meanwhile
    finds the old plan or the new one, never an empty file."""
    host.check_output("echo %s > /var/lib/batchq/%s/plan.json.new && mv /var/lib/batchq/%s/plan.json.new "
                      "/var/lib/batchq/%s/plan.json", json.dumps(plan), name, name, name)


def run(host, name, plan, wait=True):
    """Run the consumer once with plan; returns how systemd saw the run end
    (or the unit's state, wait=False)."""
    unit = UNIT % name
    host.check_output("rm -f /var/lib/batchq/%s/batches.jsonl /var/lib/batchq/%s/left-open-*", name, name)
    set_plan(host, name, plan)
    host.run("systemctl start %s" if wait else "systemctl start --no-block %s", unit)
    return show(host, unit, "Result", "ExecMainStatus", "ExecMainPID", "InvocationID", "ActiveState")


def journal_holding(host, name, invocation, *messages):
    """The run's journal, once it holds each of messages: journald may write a
    run's last lines a moment after the run ended."""
    def said():
        return host.check_output("journalctl --no-pager -o cat -u %s _SYSTEMD_INVOCATION_ID=%s", UNIT % name, invocation)

    def holding():
        text = said()
        return all(message in text for message in messages) and text
    return wait_for(holding, 30, "%s in the journal" % (messages,), explain=lambda: ":\n" + said())


def batch_lines(host, name, invocation):
    """The journal's entries of a run's batches: [(BATCHQ_BATCH, SYSLOG_IDENTIFIER, MESSAGE)], in order."""
    out = host.check_output("journalctl --no-pager -o json -u %s _SYSTEMD_INVOCATION_ID=%s", UNIT % name, invocation)
    entries = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [(e.get("BATCHQ_BATCH"), e.get("SYSLOG_IDENTIFIER"), e.get("MESSAGE")) for e in entries
            if "MESSAGE_ID" not in e and e.get("SYSLOG_IDENTIFIER") != "batchq-drain"]


def test_each_batch_runs_as_python3_script_would_and_alone(host):
    # a leak, children up to tasks_max, a thread that outlives main(), an uncaught exception
    ended = run(host, "preloaded", {"1": "leak:64", "2": "children:40", "3": "thread", "4": "raise"})
    found = records(host, "preloaded")
    context = journal(host, "preloaded")
    assert sorted(found) == [1, 2, 3, 4], context
    starts = [found[n]["start"] for n in range(1, 5)]
    runner = int(ended["ExecMainPID"])
    for number, start in enumerate(starts, 1):
        # imported once, by the runner (the unit's main process), not by the batch
        assert start["imported_by"] == runner != start["pid"], (start, context)
        assert start["argv"] == [SCRIPT, "--limit", "5"] and start["file"] == SCRIPT, start
        assert start["path0"] == FOLDER and start["own_group"], start
        # under memory_max the kernel kills the batch that grew, not the runner (batchq-drain's OOM_SCORE_RAISE)
        assert start["oom_score_adj"] == min(1000, start["runner_oom_score_adj"] + 500), start
        # what the earlier batches appended to the module's global is gone
        assert start["seen"] == [], start
        assert start["invocation"] == ended["InvocationID"], start
    # each batch its own random state, as the interpreter's fork hooks reset it
    assert len({start["random"] for start in starts}) == 4, starts
    # the 64 MiB the first batch held are not in the second
    assert starts[1]["rss_kib"] < starts[0]["rss_kib"] + 32 * 1024, starts
    # tasks_max (24) bounds the batch, runner included: some of its 40 forks were refused
    assert found[2]["children"]["refused"] > 0, found[2]
    # the runner froze what it preloaded (a batch's collector leaves it be), and
    # the collector still frees what each batch left in a reference cycle
    assert all(start["frozen"] > 1000 for start in starts), starts
    assert all("cycle-collected" in found[n] for n in range(1, 5)), found
    # atexit handlers run, after the thread the batch's main code left running; the
    # preload's own handler only once, in the runner, when the run ends
    assert all("atexit" in found[n] for n in range(1, 5)), found
    assert records(host, "preloaded", batch_records=False)["preload-atexit"]["pid"] == runner, found
    assert host.check_output("grep -c preload-atexit /var/lib/batchq/preloaded/batches.jsonl") == "1"
    # a file each batch left open is flushed at its end, as the interpreter's exit does
    assert host.check_output("cat /var/lib/batchq/preloaded/left-open-*.txt").splitlines() == [
        "batch %d" % n for n in range(1, 5)]
    assert found[3]["thread"], found[3]
    out = host.check_output("cat /var/lib/batchq/preloaded/batches.jsonl")
    assert out.index('"event": "thread"') < out.index('"event": "atexit", "batch": 3'), out
    # the uncaught exception: a traceback and status 1, as python3 gives them
    assert (ended["Result"], ended["ExecMainStatus"]) == ("exit-code", "1"), (ended, context)
    journal_holding(host, "preloaded", ended["InvocationID"], "RuntimeError: batch 4 raises",
                    *("batch %d says hello on %s" % (n, stream) for n in range(1, 5) for stream in ("stdout", "stderr")))
    lines = batch_lines(host, "preloaded", ended["InvocationID"])
    for number in range(1, 5):
        said = [message for batch, identifier, message in lines
                if batch == str(number) and identifier == "consume.py#%d" % number]
        assert "batch %d says hello on stdout" % number in said, (lines, context)
        assert "batch %d says hello on stderr" % number in said, (lines, context)
    raised = [message for batch, _identifier, message in lines if batch == "4"]
    assert "Traceback (most recent call last):" in raised and "RuntimeError: batch 4 raises" in raised, raised
    # no frame of the runner or its modules, all in the helpers' folder
    assert not any("/usr/local/lib/batchq/" in message for message in raised), \
        "the runner's frames in the traceback: %s" % raised


@pytest.mark.parametrize("plan, result, status", [
    ({"2": "signal:11"}, "signal", "11"),
    ({"1": "exit:3"}, "exit-code", "3"),
    ({"3": "exit:0"}, "success", "0"),
])
def test_python3_m_runs_the_module_from_the_working_directory(host, plan, result, status):
    ended = run(host, "preloaded-m", dict(plan, default="exit:75"))
    found = records(host, "preloaded-m")
    context = journal(host, "preloaded-m")
    assert (ended["Result"], ended["ExecMainStatus"]) == (result, status), (ended, context)
    assert sorted(found) == list(range(1, int(next(iter(plan))) + 1)), (found, context)
    for batch in found.values():
        start = batch["start"]
        # what -m gives: sys.argv[0] the module's file, sys.path[0] the working directory
        assert start["argv"] == [FOLDER + "/consume.py", "--limit", "5"], start
        assert start["path0"] == FOLDER and start["imported_by"] == int(ended["ExecMainPID"]), start


@pytest.mark.parametrize("kill", ["oom", "hang"])
def test_a_batch_killed_for_memory_or_time_leaves_the_next_run_as_preloaded(host, kill):
    ended = run(host, "preloaded", {"1": "exit:75", "2": kill})
    context = journal(host, "preloaded")
    # the run ends as its last batch did: killed for memory (by the kernel), or SIGTERM at its timeout
    expected = (memory_kill_result(host), "9") if kill == "oom" else ("signal", "15")
    assert (ended["Result"], ended["ExecMainStatus"]) == expected, (ended, context)
    # the runner lived on to record the batch's end: the kernel took the batch, not it
    killed = host.check_output("journalctl --no-pager -o json -u %s _SYSTEMD_INVOCATION_ID=%s MESSAGE_ID=%s",
                               UNIT % "preloaded", ended["InvocationID"], "4f3c5a1e9b6d4c0e8a2f7b9d1e3c5a70")
    ends = [json.loads(line) for line in killed.splitlines()]
    assert [(e["BATCHQ_BATCH"], e["BATCHQ_RESULT"]) for e in ends] == [
        ("1", "backlog"), ("2", "signal" if kill == "oom" else "timeout")], (ends, context)
    again = run(host, "preloaded", {"1": "exit:0"})
    start = records(host, "preloaded")[1]["start"]
    assert again["Result"] == "success" and start["seen"] == [] and start["imported_by"] != int(
        ended["ExecMainPID"]), (again, start)


def test_a_changed_preloaded_file_reaches_a_long_drain(host):
    name, unit = "preloaded", UNIT % "preloaded"
    try:
        run(host, name, {"default": "sleep:0.2"}, wait=False)
        wait_for(lambda: len(records(host, name)) >= 3, 30, "three batches of the drain")
        # an upgrade without a deploy: the module's file is replaced
        host.check_output("sed 's/^VERSION = 1$/VERSION = 2/' %s/heavy.py > %s/heavy.new && mv %s/heavy.new %s/heavy.py",
                          FOLDER, FOLDER, FOLDER, FOLDER)
        changed = time.time()
        upgraded = wait_for(lambda: [b["start"] for b in records(host, name).values() if b["start"]["version"] == 2],
                            30, "a batch under the new code")
        set_plan(host, name, {"default": "exit:0"})
        wait_for(lambda: show(host, unit, "ActiveState")["ActiveState"] == "inactive", 30, "the drain to end")
    finally:
        host.run("sed -i 's/^VERSION = 2$/VERSION = 1/' %s/heavy.py", FOLDER)
        host.run("systemctl stop %s", unit)
    ended = show(host, unit, "Result", "InvocationID", "ExecMainPID")
    context = journal(host, name)
    found = records(host, name)
    starts = [found[n]["start"] for n in sorted(found)]
    # the same run, the same main process (re-executed), the batch numbers going on
    assert ended["Result"] == "success", (ended, context)
    assert sorted(found) == list(range(1, len(found) + 1)), found
    assert {s["invocation"] for s in starts} == {ended["InvocationID"]}, starts
    assert {s["imported_by"] for s in starts} == {int(ended["ExecMainPID"])}, starts
    versions = [s["version"] for s in starts]
    assert versions == sorted(versions) and versions[0] == 1, versions
    # within a look for changes, the batch then running, the restart and the import again
    delay = min(s["time"] for s in upgraded) - changed
    assert delay <= CODE_CHECK_SECONDS + 0.2 + RESTART_SECONDS + IMPORT_SECONDS + MARGIN, (delay, context)
    journal_holding(host, name, ended["InvocationID"], "%s/heavy.py changed since the preload" % FOLDER)


@pytest.mark.parametrize("name, module, hazard", [
    ("preload-threads", "threaded", "started a thread"),
    ("preload-socket", "connected", "opened a socket"),
    ("preload-missing", "not_installed", "failed: ModuleNotFoundError"),
])
def test_a_module_unsafe_to_fork_or_missing_fails_the_run_naming_it(host, name, module, hazard):
    ended = run(host, name, {"default": "exit:0"})
    assert (ended["Result"], ended["ExecMainStatus"]) == ("exit-code", "1"), (ended, journal(host, name))
    assert records(host, name) == {}, "a batch was forked"
    journal_holding(host, name, ended["InvocationID"], "preload: importing %s %s" % (module, hazard))


@on_every_host_at_once
def test_a_stop_asked_during_the_preload_starts_no_batch(host):
    # as a deploy or a pause asks it (SIGUSR1: finish this batch, start no other), while the runner imports
    name, unit = "preloaded", UNIT % "preloaded"
    host.check_output("systemctl stop batchq-preloaded.timer")  # or the drain would go on at once
    # an import of 10 s (the manager's environment reaches the run): the stop comes while it lasts
    host.check_output("systemctl set-environment HEAVY_IMPORT_SECONDS=10")
    try:
        run(host, name, {"default": "exit:75"}, wait=False)
        wait_for(lambda: "drain started" in host.run("journalctl --no-pager -o cat -u %s _SYSTEMD_INVOCATION_ID=%s",
                                                     unit, show(host, unit, "InvocationID")["InvocationID"]).stdout,
                 30, "the runner to start")
        host.check_output("systemctl kill --kill-who=main --signal=SIGUSR1 %s", unit)
        wait_for(lambda: show(host, unit, "ActiveState")["ActiveState"] == "inactive", 30, "the run to end")
    finally:
        host.check_output("systemctl unset-environment HEAVY_IMPORT_SECONDS")
        ended = show(host, unit, "Result", "ExecMainStatus")
        found = records(host, name)
        # a run the timer may start now takes one batch that finds nothing to do
        set_plan(host, name, {"default": "exit:0"})
        host.check_output("systemctl start batchq-preloaded.timer")
    # a success that leaves work waiting, as any drain stopped between batches, long before the import ended
    assert ended == {"Result": "success", "ExecMainStatus": "75"}, (ended, journal(host, name))
    assert found == {}, "a batch started after the stop"


def signal_batches(host, name):
    """Run a signals.py consumer once (three batches); what each batch found, in order, and how the run ended."""
    unit = UNIT % name
    wait_for(lambda: show(host, unit, "ActiveState")["ActiveState"] in ("inactive", "failed"), 30, "%s to be idle" % name)
    host.check_output("rm -f /var/lib/batchq/%s/batches.jsonl", name)
    host.run("systemctl start %s", unit)
    ended = show(host, unit, "Result")
    out = host.run("cat /var/lib/batchq/%s/batches.jsonl 2>/dev/null || true", name).stdout
    return [json.loads(line) for line in out.splitlines()], ended


def test_a_preloaded_batch_has_the_signals_and_random_state_of_one_without_preload(host):
    plain, plain_ended = signal_batches(host, "plain-signals")
    preloaded, ended = signal_batches(host, "preload-signals")
    context = journal(host, "preload-signals") + journal(host, "plain-signals")
    assert plain_ended["Result"] == ended["Result"] == "success", (plain_ended, ended, context)
    assert [b["batch"] for b in plain] == [b["batch"] for b in preloaded] == [1, 2, 3], (plain, preloaded, context)
    # graceful.py's set-up, which the comparison below must find
    assert plain[0]["handlers"]["SIGTERM"] == "graceful" and "SIGALRM" in plain[0]["mask"], plain
    for alone, forked in zip(plain, preloaded):
        # forks of the runner, with what `python3 SCRIPT` has after the import, none of the runner's own
        assert forked["preloaded"] and not alone["preloaded"], (alone, forked)
        assert (forked["handlers"], forked["mask"]) == (alone["handlers"], alone["mask"]), (plain, preloaded)
    # the module's own generator, made once in the runner, draws anew in each batch; and random's global one
    for generator in ("own", "global"):
        assert len({b[generator] for b in preloaded}) == 3, (generator, preloaded)
