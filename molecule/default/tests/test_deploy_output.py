"""What one deploy does besides deploying, read from its own output: no
warning on hosts without secrets; each host is planned and its units that
differ from the host's verified once, in the checks' play, and the deploy play
uses that plan; a deploy in batches checks each batch again, and systemd
does not verify the same units twice; a deploy that changes nothing has no
unit to verify."""

import re

import pytest

from testlib import assert_deployed, consumers, deploy

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()

SECRETS_DIR = "/etc/batchq"
VERIFY_TASK = "Verify the unit files with systemd before they go live"
PLAN_TASK = "Plan what to do on the host"
RESULT_RE = re.compile(r"^(ok|changed|skipping|failed|fatal): \[([^\]]+)\]")


def task_results(output, task):
    """{host: [result, ...]} of every run of a task in ansible-playbook's output."""
    results = {}
    for block in output.split("\nTASK [")[1:]:
        header, body = (block + "\n").split("\n", 1)
        if task not in header:
            continue
        for line in body.splitlines():
            match = RESULT_RE.match(line)
            if match:
                results.setdefault(match.group(2), []).append(match.group(1))
            elif line.startswith(("PLAY", "RUNNING HANDLER")):
                break
    return results


@pytest.fixture(scope="module")
def deployed(hosts):
    """The output of a deploy that changes one consumer, then of one in
    batches of two hosts that changes it back, then of one that changes nothing."""
    for host in hosts:
        # none of the scenario's consumers has secrets; a test that adds some cleans up
        assert not host.file(SECRETS_DIR).exists, "%s has %s: this deploy needs a host without" % (
            host.backend.get_hostname(), SECRETS_DIR)
    outputs = []
    for variant, extra in ((consumers(fresh={"timeout": "10min"}), {}), (None, {"consumer_serial": 2}), (None, {})):
        process = deploy(variant, **extra)
        assert_deployed(process)
        outputs.append(process.output)
    return outputs


def test_the_checks_verify_each_hosts_changed_units_once(hosts, deployed):
    names = sorted(host.backend.get_hostname() for host in hosts)
    # all hosts at once: the checks' play plans and verifies, the deploy play uses its plan
    # in batches of two (more than one batch only on three hosts or more): each batch is
    # planned again, and finds the same units verified already
    batched = ["ok", "skipping"] if len(names) > 2 else ["ok"]
    for output, runs in ((deployed[0], ["ok"]), (deployed[1], batched)):
        verified, planned = task_results(output, VERIFY_TASK), task_results(output, PLAN_TASK)
        assert sorted(verified) == names, output
        for name in names:
            assert verified[name] == runs, (name, verified, output[-4000:])
            assert planned[name] == ["ok"] * len(runs), (name, planned, output[-4000:])


def test_a_deploy_that_changes_nothing_verifies_nothing_and_reports_no_change(hosts, deployed):
    results = task_results(deployed[2], VERIFY_TASK)
    for host in hosts:
        name = host.backend.get_hostname()
        assert results[name] == ["skipping"], (name, results, deployed[2][-4000:])
        assert re.search(r"^%s\s+: ok=\d+\s+changed=0\s" % re.escape(name), deployed[2], re.M), deployed[2][-3000:]


def test_a_deploy_to_hosts_without_secrets_warns_of_nothing(deployed):
    warnings = [line for output in deployed for line in output.splitlines() if "WARNING" in line]
    assert not [line for line in warnings if SECRETS_DIR in line], "\n".join(warnings)
