"""The failure hook of a drain gets the failed batch's own log lines, not
those of the batches before it in the same run. Runs after test_drain, whose
fails-exit drain failed one batch."""

import json

from test_drain import batches
from testlib import journal, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py): its failing drain calls the hook.
WATCHES = ("fails-exit",)


def test_the_hook_of_a_failed_drain_has_that_batchs_lines_only(host):
    notes = wait_for(lambda: [n for n in map(json.loads, host.run(
        "cat /var/log/batchq-hooks.jsonl 2>/dev/null || true").stdout.splitlines())
        if n["BATCHQ_CONSUMER"] == "fails-exit"], 30, "the hook of fails-exit")
    note = notes[-1]
    # fails-exit fails run after run: the hook told of one run, and that run had a failing batch
    failed = wait_for(lambda: [b for b in batches(host, "fails-exit")
                               if "failing" in b and b["invocation"] == note["BATCHQ_INVOCATION_ID"]], 10,
                      "the failed batch of the run the hook told of")[-1]
    assert (note["BATCHQ_RESULT"], note["BATCHQ_EXIT_CODE"], note["BATCHQ_EXIT_STATUS"]) == ("exit-code", "exited", "1")
    same_run = [b for b in batches(host, "fails-exit") if b["invocation"] == failed["invocation"]]
    assert len(same_run) > 1, "the failure came first in its run: nothing to tell apart"
    # the probe prints each batch's start with its number
    assert '"batch": "%s"' % failed["batch"] in note["BATCHQ_LOG"], note["BATCHQ_LOG"] + journal(host, "fails-exit")
    others = [b["batch"] for b in same_run if b["batch"] != failed["batch"]]
    assert not [n for n in others if '"batch": "%s"' % n in note["BATCHQ_LOG"]], note["BATCHQ_LOG"]
