"""After a host restarts, every enabled consumer runs start_delay after boot
(OnBootSec=; in a container systemd counts from its own start), and a paused
one stays paused. Runs last: it restarts the hosts."""

import subprocess
import time

from testlib import figure, journal, runs, scenario_vars, show, timestamp, wait_for

ENABLED = ["healthy", "crasher", "hang", "leak", "exit3", "forker", "typical", "jit"]
MARGIN = 5.0


def test_enabled_consumers_run_after_a_reboot_and_paused_stay_paused(host):
    name = host.backend.get_hostname()
    rebooted_at = time.time()
    subprocess.run(["docker", "restart", name], check=True, stdout=subprocess.DEVNULL, timeout=120)
    wait_for(lambda: host.run("systemctl is-system-running").stdout.strip() in ("running", "degraded"),
             90, "%s to finish booting" % name)
    start_delay = float(scenario_vars()["consumer_defaults"]["start_delay"].rstrip("s"))
    booted = timestamp(host.check_output("systemctl show --timestamp=us+utc --value --property=UserspaceTimestamp"))
    assert booted > rebooted_at
    delays = {}
    for consumer in ENABLED:
        first = wait_for(lambda: [t["start"] for t in runs(host, consumer) if t["start"] > booted], 60,
                         "the first run of %s after the reboot" % consumer)[0]
        delays[consumer] = first - booted
        assert start_delay - 0.5 <= delays[consumer] <= start_delay + 0.1 + MARGIN, "%.1fs%s" % (
            delays[consumer], journal(host, consumer))
    assert not [r for r in runs(host, "dormant") if r["start"] > rebooted_at]
    assert show(host, "batchq-dormant.timer", "ActiveState", "UnitFileState") == {
        "ActiveState": "inactive", "UnitFileState": "disabled"}
    figure("%s reboot: first runs %.1f-%.1fs after boot (start_delay %gs); paused stayed paused" % (
        name, min(delays.values()), max(delays.values()), start_delay))
