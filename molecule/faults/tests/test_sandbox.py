"""Every service is sandboxed, a typical consumer still works under it, one
protection can be lifted alone, and secrets stay out of units and output."""

import hashlib
import json
import re
import time

from testlib import consumer_spec, consumers, deploy, figure, finished, runs, wait_for

# The consumers whose timers run during these tests (conftest.py): the others wait.
WATCHES = ("typical",)

SANDBOXED = ["healthy", "crasher", "hang", "leak", "exit3", "forker", "typical", "jit", "dormant", "long"]


def test_every_service_scores_at_most_2_and_runs_as_batchq(host):
    scores = {}
    for name in SANDBOXED:
        out = host.check_output("systemd-analyze security batchq-%s.service", name)
        scores[name] = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out).group(1))
        assert host.check_output("systemctl show -P User batchq-%s.service", name) == "batchq"
    figure("%s systemd-analyze security: %s" % (host.backend.get_hostname(), ", ".join(
        "%s %.1f" % item for item in sorted(scores.items()))))
    assert max(scores.values()) <= 2.0, scores


def test_typical_consumer_works_under_the_sandbox(host):
    run = wait_for(lambda: finished(runs(host, "typical")), 60, "a finished run of typical")[-1]
    expected_token = consumer_spec("typical")["secret_environment"]["APP_TOKEN"]
    assert run["peer_answer"] == "pong", run  # a TCP connection to the other host
    assert run["token_sha256"] == hashlib.sha256(expected_token.encode()).hexdigest(), run
    assert host.file("/srv/batchq-out/out-%s" % run["invocation"]).user == "batchq"
    assert host.file("/var/lib/batchq/typical/cursor").contains("processed")
    assert run["peer_host"] not in host.check_output("hostname -I"), "talked to itself"


def test_one_protection_is_lifted_without_dropping_the_rest(host):
    settings = host.check_output("systemctl show -p MemoryDenyWriteExecute -p ProtectSystem -p NoNewPrivileges "
                                 "-p PrivateTmp batchq-jit.service")
    assert sorted(settings.split()) == ["MemoryDenyWriteExecute=no", "NoNewPrivileges=yes", "PrivateTmp=yes",
                                        "ProtectSystem=strict"]
    assert "MemoryDenyWriteExecute=yes" in host.check_output("systemctl show -p MemoryDenyWriteExecute "
                                                             "batchq-healthy.service")


def journal_since(host, since):
    """Every field of every journal entry since since (seconds since the epoch), as text: all units and
    programs (the deploy's modules log their arguments there too). A value that is not UTF-8 comes as bytes."""
    entries = [json.loads(line) for line in host.check_output(
        "journalctl --no-pager -o json --since @%s", str(int(since))).splitlines() if line.strip()]
    return ["%s=%s" % (key, bytes(value).decode("utf-8", "replace") if isinstance(value, list) else value)
            for entry in entries for key, value in entry.items()]


def test_secrets_stay_out_of_units_logs_and_diffs(hosts):
    secret = consumer_spec("typical")["secret_environment"]["APP_TOKEN"]
    for host in hosts:
        env_file = host.file("/etc/batchq/typical.env")
        assert (env_file.mode, env_file.user) == (0o600, "root")
        assert secret not in host.file("/etc/systemd/system/batchq-typical.service").content_string
    began = time.time()
    new_secret = "n3w-s3cret-value"
    changed = consumers(typical={"secret_environment": {"APP_TOKEN": new_secret}})
    process = deploy(changed, verbose=True)
    assert process.returncode == 0, process.output
    assert new_secret not in process.output and secret not in process.output
    assert "censored" in process.output  # the task ran, and Ansible hid it
    used = {}  # a run of typical with each secret, on each host: the runs whose logs are read below
    for host in hosts:
        token = hashlib.sha256(new_secret.encode()).hexdigest()
        used[host] = [wait_for(lambda: [r for r in finished(runs(host, "typical"))
                                        if r["token_sha256"] == token and r["start"] > began], 30,
                               "a run of typical with the new secret")[-1]]
    assert deploy().returncode == 0  # back to the scenario's secret
    for host in hosts:
        token = hashlib.sha256(secret.encode()).hexdigest()
        used[host] += wait_for(lambda: [r for r in finished(runs(host, "typical"))
                                        if r["token_sha256"] == token and r["start"] > used[host][0]["start"]], 30,
                               "a run of typical with the scenario's secret again")[-1:]
    for host in hosts:
        fields = journal_since(host, began - 1)
        # the journal of those runs is there: each run's own lines (the probe prints its invocation)
        for run in used[host]:
            assert any("MESSAGE=batchq-probe start " + run["invocation"] in field for field in fields), run
        leaks = [field for field in fields if secret in field or new_secret in field]
        assert leaks == [], leaks[:5]
