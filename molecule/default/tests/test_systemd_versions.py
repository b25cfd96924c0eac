"""The units suit each host's systemd (247 to 262 here): the sandbox scores at
most 2.0 on every version, and a host whose systemd is older than the role can
make safe is refused, by name and version, before any host changes."""

import re

from testlib import deploy, figure, host_state, scenario_vars, systemd_version

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()

# Ubuntu 20.04's systemd, below the role's oldest (247).
TOO_OLD = "systemd 245 (245.4-4ubuntu3.24)"
# Answers --version as that systemd would; hands every other call to the real one.
WRAPPER = """cat >/usr/local/sbin/systemctl <<'EOF'
#!/bin/sh
[ "$1" = --version ] && { echo '%s'; exit 0; }
exec /bin/systemctl "$@"
EOF
chmod 755 /usr/local/sbin/systemctl""" % TOO_OLD
NEWCOMER = {"name": "newcomer", "command": "/usr/local/bin/batchq-probe run"}


def test_every_service_scores_at_most_2(host):
    scores = {}
    for path in host.check_output("ls /etc/systemd/system/batchq-*.service").split():
        unit = path.rsplit("/", 1)[1].replace("@.service", "@1.service")
        out = host.check_output("systemd-analyze security %s", unit)
        scores[unit] = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out).group(1))
    assert scores, "no service to score"
    figure("%s systemd %d: systemd-analyze security at most %.1f over %d services" % (
        host.backend.get_hostname(), systemd_version(host), max(scores.values()), len(scores)))
    assert max(scores.values()) <= 2.0, scores


def test_a_host_with_an_older_systemd_is_refused_and_no_host_changes(hosts):
    """One host's systemctl answers --version as systemd 245 (a wrapper first in PATH)."""
    old = hosts[0]
    before = [host_state(host) for host in hosts]
    old.check_output(WRAPPER)
    try:
        assert old.check_output("systemctl --version") == TOO_OLD
        process = deploy(scenario_vars()["consumer_list"] + [NEWCOMER])
    finally:
        old.check_output("rm -f /usr/local/sbin/systemctl")
    assert process.returncode != 0, process.output
    message = "%s has systemd 245; the batchq.consumers.consumer role needs systemd 247 or later" % (
        old.backend.get_hostname())
    assert message in process.output, process.output[-3000:]
    assert [host_state(host) for host in hosts] == before
