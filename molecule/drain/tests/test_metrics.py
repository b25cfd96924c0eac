"""A drain writes its metrics after each batch, not only at the end of the
run: scraped from the host's node_exporter while the drain goes on."""

from test_drain import fill, left
from testlib import consumer_series, consumer_spec, journal, scenario_vars, scrape, show, span_seconds, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()


def counts(host, name, unit):
    total = consumer_series(scrape(host), name, "runs_total")
    return {result: value for (found_unit, result), value in total.items() if found_unit == unit}


def test_each_batch_of_a_drain_is_counted_as_it_ends(host):
    unit = "batchq-slow.service"
    wait_for(lambda: show(host, unit, "ActiveState")["ActiveState"] == "inactive", 120,
             "slow to end what an earlier test started", explain=lambda: journal(host, "slow"))
    before = counts(host, "slow", unit)
    fill(host, "slow", 8)
    host.check_output("systemctl start --no-block %s", unit)

    # 0.3 s batches of one item: the count grows while the same run goes on
    def grown(result, by):
        now = counts(host, "slow", unit)
        return now.get(result, 0) - before.get(result, 0) >= by and now

    during = wait_for(lambda: grown("backlog", 3), 60, "three backlog batches of slow in the metrics")
    assert show(host, unit, "ActiveState")["ActiveState"] == "activating" and left(host, "slow") > 0, journal(
        host, "slow")
    wait_for(lambda: left(host, "slow") == 0 and show(host, unit, "ActiveState")["ActiveState"] == "inactive", 60,
             "slow to empty its queue")
    after = wait_for(lambda: grown("success", 1), 30, "the last batch of slow in the metrics")
    # 8 full batches of one item, then one that finds the queue empty
    assert after.get("backlog", 0) - before.get("backlog", 0) == 8, (before, during, after)
    assert after["success"] - before.get("success", 0) == 1, (before, after)
    series = scrape(host)
    last = {metric: consumer_series(series, "slow", metric)[unit]
            for metric in ("last_run_success", "last_exit_status", "consecutive_failures", "timeout_seconds",
                           "interval_seconds")}
    spec = dict(scenario_vars()["consumer_defaults"], **consumer_spec("slow"))
    assert last == {"last_run_success": 1, "last_exit_status": 0, "consecutive_failures": 0,
                    "timeout_seconds": span_seconds(spec["timeout"]),
                    "interval_seconds": span_seconds(spec["interval"])}, last


def test_instances_of_a_drain_share_one_file_with_a_series_each(host):
    fill(host, "shared", 40)
    host.check_output("systemctl start --no-block batchq-shared@1.service batchq-shared@2.service")
    wait_for(lambda: left(host, "shared") == 0, 60, "the shared queue to empty")
    wanted = {"batchq-shared@1.service", "batchq-shared@2.service"}
    wait_for(lambda: {unit for unit, result in consumer_series(scrape(host), "shared", "runs_total")} >= wanted, 30,
             "both instances in the metrics")
    files = host.check_output("ls /var/lib/prometheus/node-exporter").split()
    assert [f for f in files if f.startswith("batchq-shared")] == [
        "batchq-shared.d", "batchq-shared.paused.prom", "batchq-shared.prom"], files
