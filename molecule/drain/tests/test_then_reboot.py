"""A host that restarts in the middle of a drain goes on draining start_delay
after boot, and the spool consumer's drain loses no file and does none twice.
Runs last: it restarts the hosts."""

from test_drain import batches, left, start_slow_drain, stop_slow_drain
from test_spool import assert_spool_drained_after_reboot, start_spool_drain
from testlib import journal, restart, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py); the others wait.
WATCHES = ("spool",)


def test_a_drain_goes_on_after_a_reboot(hosts):
    start_slow_drain(hosts)
    spool = {}
    for host in hosts:
        name = host.backend.get_hostname()
        spool[host] = start_spool_drain(host, "r")
        booted = restart(host)
        after = wait_for(lambda: [b for b in batches(host, "slow") if b["start"] > booted], 60,
                         "the drain to go on after the reboot of %s" % name)
        assert 1.0 - 0.5 <= after[0]["start"] - booted <= 1.0 + 5.0, journal(host, "slow")
        assert left(host, "slow") > 0
        spool[host] += (booted,)
    stop_slow_drain(hosts)
    for host in hosts:
        assert_spool_drained_after_reboot(host, *spool[host])
