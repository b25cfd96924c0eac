"""credentials and hook_credentials: each secret a systemd credential, a file of
the run alone. Nowhere else: not in the environment of the batch or its child,
not in a unit file, `systemctl show` or a deploy's `--diff -vv` output, not in
clear text on disk where systemd (250 and later) can decrypt it. Another
consumer of the host, running as the same account, cannot read it while the
batch runs, hardened or not. A changed value reaches the next batch (a running
drain's too) without killing the batch in flight; a removed one is deleted."""

import base64
import hashlib
import json
import subprocess

import pytest

from testlib import PREFIX, assert_deployed, consumers, deploy, journal, show, systemd_version, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()

# systemd's syntax in it (%, $, quotes, a trailing backslash) and several lines: a file takes it as it is.
# Each line carries a marker that no quoting in any output can change, to look for.
SECRET = "Kq7Zfirst pw with 'quotes' \"and\" $HOME %n 100% \\\nKq7Zsecond line\n"
ROTATED = "Kq7Zrotated " + SECRET
TOKEN = "Kq7Ztoken-7f3e"
MARKER = "Kq7Z"
STATE = "/var/lib/batchq"

# Commands are one line each (the role refuses a newline in a command).
# Writes down what it found (a digest of the credential, never the value), its own
# environment and a child's, then runs until the test creates release (at most 600 s).
KEEPER = "; ".join([
    'seen=$(sha256sum < "$CREDENTIALS_DIRECTORY/db_password" | cut -d" " -f1)',
    'echo "{\\"invocation\\": \\"$INVOCATION_ID\\", \\"seen\\": \\"$seen\\"}" >> "$STATE_DIRECTORY/seen.jsonl"',
    'tr "\\0" "\\n" < /proc/self/environ > "$STATE_DIRECTORY/environ"',
    'sh -c "tr \\"\\\\0\\" \\"\\\\n\\" < /proc/self/environ" > "$STATE_DIRECTORY/child-environ"',
    'i=0',
    'while [ ! -e "$STATE_DIRECTORY/release" ] && [ $i -lt 3000 ]; do sleep 0.2; i=$((i + 1)); done',
])
# Tries to read the keeper's credential where systemd holds it during a run.
NOSY = ('cat /run/credentials/batchq-keeper.service/db_password > "$STATE_DIRECTORY/stolen" 2> "$STATE_DIRECTORY/error";'
        ' echo $? > "$STATE_DIRECTORY/status"')
# A drain while the test keeps a backlog file: batch after batch (exit 75), each
# writing down what it read; without the file, one batch a run, exit 0.
DRAINER = "; ".join([
    'seen=$(sha256sum < "$CREDENTIALS_DIRECTORY/db_password" | cut -d" " -f1)',
    'echo "{\\"invocation\\": \\"$INVOCATION_ID\\", \\"batch\\": $BATCHQ_BATCH, \\"seen\\": \\"$seen\\"}"'
    ' >> "$STATE_DIRECTORY/seen.jsonl"',
    '[ -e "$STATE_DIRECTORY/backlog" ] || exit 0',
    'sleep 0.3',
    'exit 75',
])
# A batch that fails: its hook writes down what its own credentials directory holds.
HOOK = ["/bin/sh", "-c", 'cat "$CREDENTIALS_DIRECTORY/webhook_token" > /run/batchq-hook-token']
ALARMED = 'ls "${CREDENTIALS_DIRECTORY:-/nonexistent}" > "$STATE_DIRECTORY/own-credentials" 2>&1; exit 3'


def digest(text):
    return hashlib.sha256(text.encode()).hexdigest()


def shell(name, script, **fields):
    return dict({"name": name, "command": ["/bin/sh", "-c", script], "interval": "1h", "start_delay": "1h"}, **fields)


def keeper(secret=SECRET, **fields):
    return shell("keeper", KEEPER, credentials={"db_password": secret} if secret else {}, **fields)


def the_consumers(**keeper_fields):
    return consumers() + [
        keeper(**keeper_fields),
        shell("nosy", NOSY),
        shell("nosy-unhardened", NOSY, hardening=False),
        shell("drainer", DRAINER, credentials={"db_password": keeper_fields.get("secret") or SECRET},
              backlog_exit_code=75, interval="2s", start_delay="1s"),
        shell("alarmed", ALARMED, on_failure=HOOK, hook_credentials={"webhook_token": TOKEN}),
    ]


def seen(host, name):
    out = host.run("cat %s/%s/seen.jsonl 2>/dev/null", STATE, name).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def encrypted(host):
    return systemd_version(host) >= 250


def stored(host, consumer, name):
    """Where the role keeps a credential on this host: encrypted files have a name of their own."""
    return "/etc/batchq/%s.%s.cred%s" % (consumer, name, "-encrypted" if encrypted(host) else "")


def assert_told_nothing(process):
    assert MARKER not in process.output, "a secret in the deploy's --diff -vv output"


def start_keeper(host):
    """A new held batch of the keeper, once the last one has ended (a start while it
    still runs would join it)."""
    wait_for(lambda: show(host, PREFIX + "keeper.service", "ActiveState")["ActiveState"] in ("inactive", "failed"),
             60, "the keeper's last batch to end on %s" % host.backend.get_hostname())
    host.check_output("rm -f %s/keeper/release %s/keeper/seen.jsonl && systemctl start --no-block %s",
                      STATE, STATE, PREFIX + "keeper.service")


@pytest.fixture(scope="module")
def deployed(hosts):
    process = deploy(the_consumers(), verbose=True)
    assert_deployed(process)
    yield process
    assert_deployed(deploy(consumers() + [{"name": name, "state": "absent"}
                                          for name in ("keeper", "nosy", "nosy-unhardened", "drainer", "alarmed")]))
    for host in hosts:
        host.run("rm -f /run/batchq-hook-token; rmdir /etc/batchq")


def test_the_secret_is_in_no_output_unit_or_environment_and_encrypted_at_rest(hosts, deployed):
    assert_told_nothing(deployed)
    for host in hosts:
        for unit in ("keeper", "alarmed"):
            text = host.check_output("systemctl cat %s && systemctl show %s", PREFIX + unit + ".service",
                                     PREFIX + unit + ".service")
            assert MARKER not in text, text
        unit = host.check_output("systemctl cat %s", PREFIX + "keeper.service")
        setting = "LoadCredentialEncrypted" if encrypted(host) else "LoadCredential"
        path = stored(host, "keeper", "db_password")
        assert "\n%s=db_password:%s\n" % (setting, path) in unit, unit
        # on disk: root's alone, and not the value where systemd can decrypt
        file = host.file(path)
        assert (file.user, file.group, file.mode) == ("root", "root", 0o600)
        if encrypted(host):
            assert MARKER not in host.check_output("cat %s", path)
            assert host.check_output("systemd-creds decrypt --name=db_password %s - | sha256sum | cut -d' ' -f1",
                                     path) == digest(SECRET)
        else:
            assert host.check_output("base64 -w0 %s", path) == base64.b64encode(SECRET.encode()).decode()


def test_only_the_batch_reads_it_and_not_from_its_environment(hosts, deployed):
    for host in hosts:
        start_keeper(host)
    try:
        for host in hosts:
            name = host.backend.get_hostname()
            runs = wait_for(lambda: seen(host, "keeper"), 60, "the keeper's batch on %s" % name)
            assert runs[-1]["seen"] == digest(SECRET), journal(host, "keeper")
            assert show(host, PREFIX + "keeper.service", "ActiveState")["ActiveState"] == "activating"
            # where systemd holds it during the run, as root sees it from outside
            assert host.check_output("cat /run/credentials/%s | sha256sum | cut -d' ' -f1",
                                     PREFIX + "keeper.service/db_password") == digest(SECRET)
            for nosy in ("nosy", "nosy-unhardened"):
                host.check_output("systemctl start %s", PREFIX + nosy + ".service")
                status = host.check_output("cat %s/%s/status", STATE, nosy)
                stolen = host.check_output("cat %s/%s/stolen", STATE, nosy)
                assert status != "0" and stolen == "", (name, nosy, host.check_output("cat %s/%s/error", STATE, nosy))
            for environ in ("environ", "child-environ"):
                text = host.check_output("cat %s/keeper/%s", STATE, environ)
                assert MARKER not in text and "CREDENTIALS_DIRECTORY=" in text, (name, environ)
    finally:
        for host in hosts:
            host.check_output("touch %s/keeper/release", STATE)


def test_a_rotated_secret_reaches_the_next_batch_and_spares_the_one_in_flight(hosts, deployed):
    try:
        for host in hosts:
            start_keeper(host)
            host.check_output("rm -f %s/drainer/seen.jsonl && touch %s/drainer/backlog", STATE, STATE)
        for host in hosts:
            wait_for(lambda: seen(host, "keeper") and [run for run in seen(host, "drainer") if run["batch"] >= 2], 60,
                     "the keeper and a draining drainer on %s" % host.backend.get_hostname())
        in_flight = {host.backend.get_hostname(): seen(host, "keeper")[-1]["invocation"] for host in hosts}
        rotation = deploy(the_consumers(secret=ROTATED), verbose=True)
        assert_deployed(rotation)
        assert_told_nothing(rotation)
        for host in hosts:
            name = host.backend.get_hostname()
            # the batch in flight runs on, with the value it started with
            assert show(host, PREFIX + "keeper.service", "ActiveState", "InvocationID") == {
                "ActiveState": "activating", "InvocationID": in_flight[name]}, journal(host, "keeper")
            host.check_output("touch %s/keeper/release", STATE)
            wait_for(lambda: show(host, PREFIX + "keeper.service", "ActiveState")["ActiveState"] == "inactive", 60,
                     "the keeper's batch to end on %s" % name)
            host.check_output("systemctl start %s", PREFIX + "keeper.service")
            assert [run["seen"] for run in seen(host, "keeper")] == [digest(SECRET), digest(ROTATED)], journal(host, "keeper")
            # the drain ended after its batch in flight, and a later batch read the new value
            # (at once through batchq.continue@ on systemd 250+, at the next timer, 2 s, on 247)
            wait_for(lambda: seen(host, "drainer")[-1]["seen"] == digest(ROTATED), 60,
                     "a drainer batch with the rotated value on %s" % name)
            host.check_output("rm %s/drainer/backlog", STATE)
            # every batch of the run in flight at the deploy read the value it started with
            drained = seen(host, "drainer")
            draining = next(run["invocation"] for run in drained if run["batch"] >= 2)
            assert {run["seen"] for run in drained if run["invocation"] == draining} == {digest(SECRET)}, drained
    finally:  # nothing held for the next test, whatever failed here
        for host in hosts:
            host.run("touch %s/keeper/release; rm -f %s/drainer/backlog", STATE, STATE)


def test_a_hook_reads_its_own_credential_and_the_batch_has_none_of_it(hosts, deployed):
    for host in hosts:
        host.run("rm -f /run/batchq-hook-token")
        host.run("systemctl start %s", PREFIX + "alarmed.service")
    for host in hosts:
        name = host.backend.get_hostname()
        wait_for(lambda: host.run("cat /run/batchq-hook-token").stdout == TOKEN, 60, "the hook on %s" % name)
        assert "webhook_token" not in host.check_output("cat %s/alarmed/own-credentials", STATE)


def test_a_removed_credential_is_deleted_and_no_unit_names_it(hosts, deployed):
    assert_deployed(deploy(the_consumers(secret=None)))
    for host in hosts:
        assert not host.file(stored(host, "keeper", "db_password")).exists
        assert "LoadCredential" not in host.check_output("systemctl cat %s", PREFIX + "keeper.service")
        # the others keep theirs
        assert host.file(stored(host, "drainer", "db_password")).exists
        assert host.file(stored(host, "alarmed", "webhook_token").replace(".cred", ".hookcred")).exists


def test_the_container_shares_run_alone_and_a_copy_into_it_adds_no_mounts(host, tmp_path):
    # The images share /run (their shared-mounts.service), where systemd mounts a
    # run's credentials, and leave / private: with / shared, each `docker cp`
    # brought another copy of the engine's /sys/fs/cgroup mounts, and every
    # sandboxed start grew slower with them.
    def propagation(mount_point):
        line = host.check_output("findmnt --noheadings --output PROPAGATION --mountpoint %s", mount_point)
        return line.split(",")[0].strip()

    assert propagation("/run") == "shared"
    assert propagation("/") == "private"

    def mounts():
        # not the credentials of runs, which come and go with the consumers' runs
        return int(host.check_output("grep -v -c ' /run/credentials/' /proc/1/mountinfo"))

    before = mounts()
    copied = tmp_path / "copied"
    copied.write_text("a file\n")
    container = host.ansible.get_variables().get("ansible_host", host.backend.host)
    for copy in ("/tmp/copied", "/tmp/copied-again"):
        subprocess.run(["docker", "cp", "-q", str(copied), "%s:%s" % (container, copy)], check=True, timeout=60)
    assert mounts() == before
