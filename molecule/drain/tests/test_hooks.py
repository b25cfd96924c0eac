"""The failure hook of a drain gets the failed batch's own log lines, not
those of the batches before it in the same run."""

import json

from test_drain import batches, fill, kick
from testlib import journal, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py): its failing drain calls the hook.
WATCHES = ("fails-exit",)


def hook_notes(host, name):
    return [note for note in map(json.loads, host.run(
        "cat /var/log/batchq-hooks.jsonl 2>/dev/null || true").stdout.splitlines()) if note["BATCHQ_CONSUMER"] == name]


def test_the_hook_of_a_failed_drain_has_that_batchs_lines_only(host):
    # 100 items: the batch that leaves 50 fails (test_drain.py), after five batches of its run
    before = len(batches(host, "fails-exit"))
    fill(host, "fails-exit", 100)
    kick(host, "batchq-fails-exit.service")
    failed = wait_for(lambda: [b for b in batches(host, "fails-exit")[before:] if "failing" in b], 60,
                      "the failing batch of fails-exit")[0]
    note = wait_for(lambda: [n for n in hook_notes(host, "fails-exit") if n["BATCHQ_INVOCATION_ID"] == failed["invocation"]],
                    30, "the hook of the failed run", explain=lambda: journal(host, "fails-exit"))[0]
    assert (note["BATCHQ_RESULT"], note["BATCHQ_EXIT_CODE"], note["BATCHQ_EXIT_STATUS"]) == ("exit-code", "exited", "1")
    same_run = [b for b in batches(host, "fails-exit") if b["invocation"] == failed["invocation"]]
    assert len(same_run) > 1, "the failure came first in its run: nothing to tell apart" + journal(host, "fails-exit")
    # the probe prints each batch's start with its number
    assert '"batch": "%s"' % failed["batch"] in note["BATCHQ_LOG"], note["BATCHQ_LOG"] + journal(host, "fails-exit")
    others = [b["batch"] for b in same_run if b["batch"] != failed["batch"]]
    assert not [n for n in others if '"batch": "%s"' % n in note["BATCHQ_LOG"]], note["BATCHQ_LOG"]
