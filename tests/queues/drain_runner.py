"""The role's drain runner (batchq-drain) as the queue tests run it: by hand, without systemd.

The runner reads what it needs of a consumer from a runtime spec (a JSON
file that a deploy writes beside the consumer's units) and is told which
unit it runs as: batchq-drain --spec PATH --unit UNIT -- COMMAND... The tests
write a spec of their own. tests/queues/test_library.py runs the runner on
this machine; tests/pgqueue/test_pgqueue.py in a client container, where
conftest.py copies the runner and the modules it imports from its own folder.
"""

import json
import pathlib

FILES = pathlib.Path(__file__).resolve().parents[2] / "roles" / "consumer" / "files"
RUNNER = FILES / "batchq-drain"
# The runner's own modules and the run protocol: it imports them from its folder.
MODULES = sorted(FILES.glob("*.py"))
UNIT = "batchq-tests.service"


def spec(timeout_s, stop_timeout_s, backlog_exit_code=75):
    """The text of a runtime spec: the fields the runner reads (consumer_protocol.SPEC_FIELDS). No
    metrics folder, no hooks: a batch's timeout and stop timeout, and the status that says more work waits."""
    return json.dumps({"spec_version": 1, "consumer": "tests", "services": [UNIT],
                       "backlog_exit_code": backlog_exit_code, "timeout_usec": int(timeout_s * 1e6),
                       "stop_timeout_usec": int(stop_timeout_s * 1e6), "interval_usec": 10000000, "preload": [],
                       "metrics_folder": None, "hooks": None, "hook_credentials": None, "running_max": None})


def arguments(spec_path, command):
    """The runner's arguments: the spec at spec_path, this UNIT, then command, a batch's argv."""
    return ["--spec", str(spec_path), "--unit", UNIT, "--"] + [str(word) for word in command]
