"""After a host restarts, every enabled consumer runs start_delay after boot
(OnBootSec=; in a container systemd counts from its own start), and a paused
one stays paused. Runs last: it restarts the hosts."""

import time

from testlib import (activations, consumer_series, due_after_boot, figure, journal, on_every_host_at_once, restart,
                     runs, scenario_vars, scrape, show, wait_for)

ENABLED = ["healthy", "crasher", "hang", "leak", "exit3", "forker", "typical", "jit"]
# The consumers whose timers run during these tests (conftest.py): the others wait.
WATCHES = tuple(ENABLED)
MARGIN = 5.0


@on_every_host_at_once
def test_enabled_consumers_run_after_a_reboot_and_paused_stay_paused(host):
    name = host.backend.get_hostname()
    # stop the count first: runs_total must go on from here after the reboot
    host.check_output("systemctl stop batchq-healthy.timer")
    wait_for(lambda: show(host, "batchq-healthy.service", "ActiveState")["ActiveState"] == "inactive", 30,
             "the last batch of healthy to end")

    def healthy_runs_counted():
        return sum(consumer_series(scrape(host), "healthy", "runs_total").values())

    counted = healthy_runs_counted()
    assert counted >= 3
    rebooted_at = time.time()
    booted = restart(host)
    start_delay = float(scenario_vars()["consumer_defaults"]["start_delay"].rstrip("s"))
    delays = {}
    for consumer in ENABLED:
        # by systemd's clock, when the timer started the service: the process
        # itself took up to 6 s more to start on a loaded CI machine
        first = wait_for(lambda: [t for t in activations(host, "batchq-%s.service" % consumer) if t > booted], 60,
                         "the first start of %s after the reboot" % consumer)[0]
        wait_for(lambda: [t["start"] for t in runs(host, consumer) if t["start"] > booted], 60,
                 "the first run of %s after the reboot" % consumer)
        due = due_after_boot(host, "batchq-%s.timer" % consumer, booted, start_delay)
        delays[consumer] = first - booted
        assert start_delay - 0.5 <= delays[consumer] and first <= due + 0.1 + MARGIN, (
            "%.1fs after boot, due %.1fs after boot%s" % (delays[consumer], due - booted, journal(host, consumer)))
    assert not [r for r in runs(host, "dormant") if r["start"] > rebooted_at]
    assert show(host, "batchq-dormant.timer", "ActiveState", "UnitFileState") == {
        "ActiveState": "inactive", "UnitFileState": "disabled"}
    # the counter lives in /var/lib: it goes on from there, it does not start again at 0
    wait_for(lambda: healthy_runs_counted() > counted, 60, "runs_total of healthy beyond %d after the reboot" % counted)
    figure("%s reboot: first runs %.1f-%.1fs after boot (start_delay %gs); paused stayed paused" % (
        name, min(delays.values()), max(delays.values()), start_delay))
