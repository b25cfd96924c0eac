"""A deploy whose daemon-reload failed (or whose connection dropped after the
unit files were moved into place) is finished by the next deploy: the role
asks systemd whether it runs the files on disk (NeedDaemonReload=), not only
whether the files changed. So is what someone changed by hand: a timer
stopped and disabled, a metrics file deleted, a helper edited."""

import hashlib
import pathlib

from testlib import assert_deployed, consumers, deploy, show, wait_for

# The consumers with a short interval whose timers run during these tests
# (conftest.py): serial's service stays loaded between runs, so only a reload
# reads its new file.
WATCHES = ("serial",)

# Fails daemon-reload as a lost connection or a broken reload would; hands
# every other call to the real systemctl (/usr/bin/systemctl). In /usr/sbin,
# which comes before /usr/bin in every PATH a module gets here: Debian
# testing's sudo has no /usr/local/sbin in its secure_path.
WRAPPER = "/usr/sbin/systemctl"
BROKEN_RELOAD = """cat >%s <<'EOF'
#!/bin/sh
[ "$1" = daemon-reload ] && { echo 'Failed to reload daemon: Connection timed out' >&2; exit 1; }
exec /usr/bin/systemctl "$@"
EOF
chmod 755 %s""" % (WRAPPER, WRAPPER)
HELPER = "batchq_metrics.py"
HELPER_TEXT = (pathlib.Path(__file__).parents[3] / "roles" / "consumer" / "files" / HELPER).read_bytes()
PAUSED_FILE = "/var/lib/prometheus/node-exporter/batchq-verbatim.paused.prom"

# serial runs every second: its service stays loaded, so only a reload can
# make systemd read the new file (a unit that is not loaded is read afresh).
TAGGED = {"serial": {"command": "/usr/local/bin/batchq-probe run --sleep 3 --tag reloaded"}}


def test_a_failed_daemon_reload_is_done_by_the_next_deploy(hosts):
    for host in hosts:
        host.check_output(BROKEN_RELOAD)
    try:
        failed = deploy(consumers(**TAGGED))
    finally:
        for host in hosts:
            host.check_output("rm -f %s", WRAPPER)
    assert failed.returncode != 0, failed.output
    # every host's deploy failed at the reload, none got past it
    stopped = {line.split("[", 1)[1].split("]", 1)[0] for line in failed.output.splitlines()
               if line.startswith("fatal: [") and "Failed to reload daemon: Connection timed out" in line}
    assert stopped == {host.backend.get_hostname() for host in hosts}, failed.output[-4000:]
    for host in hosts:
        # the new file is in place, systemd still runs the old one
        # (the role writes each word of the command quoted)
        assert '"--tag" "reloaded"' in host.file("/etc/systemd/system/batchq-serial.service").content_string, \
            failed.output[-4000:]
        # the manager's own "Reloading" lines say who reloaded it meanwhile, if anyone did
        reloads = host.run("journalctl --no-pager -o short-precise -n 20 _PID=1 --grep='Reload'").stdout
        assert show(host, "batchq-serial.service", "NeedDaemonReload")["NeedDaemonReload"] == "yes", (
            host.backend.get_hostname(), reloads, failed.output[-4000:])
    again = deploy(consumers(**TAGGED))
    assert_deployed(again)
    assert "changed=0" not in again.output, "the second deploy saw nothing to do"
    for host in hosts:
        state = show(host, "batchq-serial.service", "NeedDaemonReload", "ExecStart")
        assert state["NeedDaemonReload"] == "no" and "--tag reloaded" in state["ExecStart"], state
    # Changes by hand that no unit file shows; the deploy back to the
    # scenario's own definitions must put them right too.
    for host in hosts:
        host.check_output("systemctl disable --now batchq-verbatim.timer && rm %s && echo '# edited' >> %s",
                          PAUSED_FILE, "/usr/local/lib/batchq/" + HELPER)
    assert_deployed(deploy())
    for host in hosts:
        name = host.backend.get_hostname()
        assert show(host, "batchq-verbatim.timer", "UnitFileState")["UnitFileState"] == "enabled", name
        # started start_delay (1s) after the deploy, by its starter: between the
        # two, for a moment, neither is active
        wait_for(lambda: show(host, "batchq-verbatim.timer", "ActiveState")["ActiveState"] == "active", 30,
                 "the timer of verbatim on %s to start again" % name)
        assert host.file(PAUSED_FILE).exists, name
        assert host.file("/usr/local/lib/batchq/" + HELPER).sha256sum == hashlib.sha256(HELPER_TEXT).hexdigest(), name
