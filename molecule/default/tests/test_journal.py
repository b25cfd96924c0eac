"""Every line a batch prints is in its unit's journal, under its run, however
fast the batch exits: a drain's batches (whose output the runner relays, with
the batch's own identifier and number) and a plain consumer's runs (whose
stdout systemd connects). Counted line by line, not sampled."""

import json

from testlib import consumer_info, journal, on_every_host_at_once, show, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()

BATCHES = 200


def entries(host, unit, invocation):
    """The journal entries of one run of unit, as journalctl -u finds them."""
    out = host.check_output(
        "journalctl --no-pager --output=json --output-fields=MESSAGE,SYSLOG_IDENTIFIER,BATCHQ_BATCH,_PID "
        "-u %s _SYSTEMD_INVOCATION_ID=%s", unit, invocation)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def lines_of(host, unit, invocation, marker, count):
    """The (SYSLOG_IDENTIFIER, BATCHQ_BATCH, MESSAGE) of the run's lines that
    hold marker, once there are count of them: journald may write the last
    ones a moment after the run ended."""
    def found():
        lines = [(e.get("SYSLOG_IDENTIFIER"), e.get("BATCHQ_BATCH"), e.get("MESSAGE"))
                 for e in entries(host, unit, invocation) if marker in e.get("MESSAGE", "")]
        return lines if len(lines) >= count else None
    return wait_for(found, 30, "%d lines of run %s under %s" % (count, invocation, unit))


def run_to_its_end(host, unit):
    """Start unit and wait for its run to end; returns that run's invocation ID."""
    before = show(host, unit, "InvocationID")["InvocationID"]
    host.check_output("systemctl start --no-block %s", unit)

    def ended():
        state = show(host, unit, "ActiveState", "InvocationID")
        done = state["ActiveState"] in ("inactive", "failed") and state["InvocationID"] not in ("", before)
        return done and state["InvocationID"]
    return wait_for(ended, 120, "a run of %s to end" % unit)


def test_every_line_of_every_batch_of_a_drain_is_under_its_unit_and_run(host):
    unit = "batchq-chatty.service"
    invocation = run_to_its_end(host, unit)
    state = show(host, unit, "Result", "ExecMainPID", "StatusText")
    assert state["Result"] == "success", journal(host, "chatty")
    assert state["StatusText"].startswith("batch %d ended: success 0 after " % BATCHES), state
    expected = {("sh#%d" % n, str(n), "%s of batch %d" % (stream, n)) for n in range(1, BATCHES + 1)
                for stream in ("out", "err")}
    found = lines_of(host, unit, invocation, "of batch", len(expected))
    assert sorted(found) == sorted(expected), "lines doubled or without their batch's fields"
    # relayed by the runner, the run's main process: fields no other process can forge
    assert {e["_PID"] for e in entries(host, unit, invocation) if "BATCHQ_BATCH" in e} == {state["ExecMainPID"]}

    last = consumer_info(host, names="chatty", log_lines=10)["consumers"]["chatty"]["last_run"]
    assert last["invocation_id"] == invocation and last["batches"] == BATCHES, last
    assert last["log"] == ["out of batch %d" % BATCHES, "err of batch %d" % BATCHES], last["log"]


@on_every_host_at_once
def test_every_line_of_a_plain_consumer_that_exits_at_once_is_under_its_unit_and_run(host):
    unit = "batchq-chatty-plain.service"
    for run in range(20):
        invocation = run_to_its_end(host, unit)
        found = [message for identifier, batch, message in lines_of(host, unit, invocation, "of run", 2)]
        assert found == ["out of run %s" % invocation, "err of run %s" % invocation], (run, journal(host, "chatty-plain"))
