"""What one deploy does besides deploying, read from its own output: no
warning on hosts without secrets, and systemd verifies each host's units once
in the checks, not again in the role's own."""

import re

import pytest

from testlib import assert_deployed, deploy

SECRETS_DIR = "/etc/batchq"
VERIFY_TASK = "Verify the unit files with systemd before they go live"
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
    for host in hosts:
        # none of the scenario's consumers has secrets; a test that adds some cleans up
        assert not host.file(SECRETS_DIR).exists, "%s has %s: this deploy needs a host without" % (
            host.backend.get_hostname(), SECRETS_DIR)
    process = deploy()
    assert_deployed(process)
    return process.output


def test_the_checks_verify_each_hosts_units_once(hosts, deployed):
    results = task_results(deployed, VERIFY_TASK)
    names = sorted(host.backend.get_hostname() for host in hosts)
    assert sorted(results) == names, deployed
    for name in names:
        # the playbook's checks of every host verify, the role's own checks
        # then find the same units already verified
        assert results[name] == ["ok", "skipping"], (name, results, deployed[-4000:])


def test_a_deploy_to_hosts_without_secrets_warns_of_nothing(deployed):
    warnings = [line for line in deployed.splitlines() if "WARNING" in line]
    assert not [line for line in warnings if SECRETS_DIR in line], "\n".join(warnings)
