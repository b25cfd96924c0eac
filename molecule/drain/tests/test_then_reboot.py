"""A host that restarts in the middle of a drain goes on draining start_delay
after boot, and the spool consumer's drain loses no file and does none twice.
Runs last: it restarts the hosts."""

import subprocess
import time

from test_drain import batches, left, start_slow_drain, stop_slow_drain
from test_spool import assert_spool_drained_after_reboot, start_spool_drain
from testlib import journal, show, timestamp, wait_for


def test_a_drain_goes_on_after_a_reboot(hosts):
    start_slow_drain(hosts)
    spool = {}
    for host in hosts:
        name = host.backend.get_hostname()
        spool[host] = start_spool_drain(host, "r")
        rebooted_at = time.time()
        subprocess.run(["docker", "restart", name], check=True, stdout=subprocess.DEVNULL, timeout=120)
        # a generous deadline: a boot took over 90 s on a loaded CI machine
        wait_for(lambda: host.run("systemctl is-system-running").stdout.strip() in ("running", "degraded"),
                 240, "%s to finish booting" % name)
        booted = timestamp(show(host, None, "UserspaceTimestamp")["UserspaceTimestamp"])
        assert booted > rebooted_at
        after = wait_for(lambda: [b for b in batches(host, "slow") if b["start"] > booted], 60,
                         "the drain to go on after the reboot of %s" % name)
        assert 1.0 - 0.5 <= after[0]["start"] - booted <= 1.0 + 5.0, journal(host, "slow")
        assert left(host, "slow") > 0
        spool[host] += (booted,)
    stop_slow_drain(hosts)
    for host in hosts:
        assert_spool_drained_after_reboot(host, *spool[host])
