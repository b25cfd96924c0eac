"""A host that restarts in the middle of a drain goes on draining start_delay
after boot, and the spool consumer's drain loses no file and does none twice.
Runs last: it restarts the hosts."""

from test_drain import batches, left, start_slow_drain, stop_slow_drain
from test_spool import assert_spool_drained_after_reboot, start_spool_drain
from testlib import activations, due_after_boot, journal, restart, side_by_side, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py); the others wait.
WATCHES = ("spool",)


def test_a_drain_goes_on_after_a_reboot(hosts):
    start_slow_drain(hosts)
    # the hosts restart side by side: each waits start_delay and more after its boot
    spool = dict(zip(hosts, side_by_side(reboot_during_the_drains, hosts)))
    stop_slow_drain(hosts)
    for host in hosts:
        assert_spool_drained_after_reboot(host, *spool[host])


def reboot_during_the_drains(host):
    """Restart host while its slow drain and a spool drain go on; returns what
    assert_spool_drained_after_reboot needs."""
    name = host.backend.get_hostname()
    enqueued, before = start_spool_drain(host, "r")
    booted = restart(host)
    wait_for(lambda: [b for b in batches(host, "slow") if b["start"] > booted], 60,
             "the drain to go on after the reboot of %s" % name)
    # By systemd's clock, when the timer started the drain: its first
    # batch took seconds more to start on a loaded CI machine.
    first = [t for t in activations(host, "batchq-slow.service") if t > booted][0]
    due = due_after_boot(host, "batchq-slow.timer", booted, 1.0)
    assert booted + 1.0 - 0.5 <= first <= due + 5.0, "%.1fs after boot, due %.1fs after boot%s" % (
        first - booted, due - booted, journal(host, "slow"))
    assert left(host, "slow") > 0
    return enqueued, before, booted
