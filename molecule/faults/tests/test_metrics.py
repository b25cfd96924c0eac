"""Prometheus metrics after every batch, scraped from the host's real
node_exporter (textfile collector) and judged against the consumers' own
records and systemd's: a success, exit 3, a signal and a timeout."""

import json

from testlib import consumer_series, figure, finished, journal, runs, scenario_vars, scrape, wait_for

# The consumers whose timers run during these tests (conftest.py): the others wait.
WATCHES = ("healthy", "crasher", "hang", "exit3")


def counted(total):
    """The results counted at least once; the others a rule may watch are there at 0."""
    assert {result for unit, result in total} >= {"success", "exit-code", "signal", "timeout"}, total
    return {key: value for key, value in total.items() if value}


def one(series, name, metric, **labels):
    values = consumer_series(series, name, metric, **labels)
    assert len(values) == 1, (name, metric, values)
    return next(iter(values.values()))


def scraped_between_runs(host, name, count):
    """The consumer's finished runs before and after one scrape, and the scrape."""
    wait_for(lambda: len(runs(host, name)) >= count, 60, "%d runs of %s" % (count, name))
    before = runs(host, name)
    series = scrape(host)
    return before, series, runs(host, name)


def test_a_healthy_consumer_reports_each_success_with_its_own_times(host):
    before, series, after = scraped_between_runs(host, "healthy", 3)
    total = counted(consumer_series(series, "healthy", "runs_total"))
    # the probe records its end a moment before systemd ends the run
    assert list(total) == [("batchq-healthy.service", "success")], total
    assert len(finished(before)) - 1 <= total[("batchq-healthy.service", "success")] <= len(after), journal(host, "healthy")
    start, end = one(series, "healthy", "last_run_start_timestamp_seconds"), one(
        series, "healthy", "last_run_end_timestamp_seconds")
    # the probe's own start and end of exactly one run lie inside the run the metrics describe
    inside = [run for run in after if start <= run["start"] and run.get("end", float("inf")) <= end]
    assert len(inside) == 1, (start, end, after[-3:])
    assert abs(one(series, "healthy", "last_run_duration_seconds") - (end - start)) < 0.001
    assert one(series, "healthy", "last_success_timestamp_seconds") == end
    assert one(series, "healthy", "last_run_success") == 1
    assert one(series, "healthy", "last_exit_status") == 0
    assert one(series, "healthy", "consecutive_failures") == 0
    assert one(series, "healthy", "interval_seconds") == float(scenario_vars()["consumer_defaults"]["interval"].rstrip("s"))
    assert one(series, "healthy", "timeout_seconds") == 3600  # the role's default, 1h


def test_exit_3_counts_as_exit_code_failures_in_a_row(host):
    before, series, after = scraped_between_runs(host, "exit3", 3)
    total = counted(consumer_series(series, "exit3", "runs_total"))
    assert list(total) == [("batchq-exit3.service", "exit-code")], total
    assert len(finished(before)) - 1 <= total[("batchq-exit3.service", "exit-code")] <= len(after)
    assert one(series, "exit3", "consecutive_failures") == total[("batchq-exit3.service", "exit-code")]
    assert one(series, "exit3", "last_exit_status") == 3
    assert one(series, "exit3", "last_run_success") == 0
    assert not consumer_series(series, "exit3", "last_success_timestamp_seconds")


def test_a_crash_counts_as_a_signal_with_status_128_plus_segv(host):
    before, series, after = scraped_between_runs(host, "crasher", 3)
    total = counted(consumer_series(series, "crasher", "runs_total"))
    # systemd says core-dump where the kernel wrote a core, signal otherwise
    assert set(result for unit, result in total) <= {"signal", "core-dump"}, total
    # the probe records no end when it is killed; one may still be ending
    assert len(before) - 1 <= sum(total.values()) <= len(after), (total, len(before), len(after))
    assert one(series, "crasher", "last_exit_status") == 128 + 11
    assert one(series, "crasher", "last_run_success") == 0


def test_a_hung_batch_counts_as_a_timeout_after_its_timeout(host):
    wait_for(lambda: any(consumer_series(scrape(host), "hang", "runs_total", result="timeout").values()), 60,
             "a timeout of hang in the metrics")
    series = scrape(host)
    assert one(series, "hang", "timeout_seconds") == 3
    # the manager arms the timeout, then spawns the run's process (most of a
    # second on a loaded host), and the run's start is taken at the spawn
    assert 3.0 - 1.0 <= one(series, "hang", "last_run_duration_seconds") <= 3.0 + 1.5, journal(host, "hang")
    # SIGTERM at the timeout
    assert one(series, "hang", "last_exit_status") == 128 + 15
    assert one(series, "hang", "last_run_success") == 0


# Reads a metrics file as fast as it can while COMMAND rewrites it COUNT times,
# one after another, and prints what it read. A read is whole when it ends
# with a newline, every line is a comment or a sample that parses, and it holds
# every series of the first read (a consumer's file keeps its series: each
# result is there from the first run on, at 0). Python 3.9 (Debian 11).
READ_WHILE_REWRITTEN = r"""
import hashlib, json, re, subprocess, sys, threading
path, count, command = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
COMMENT = re.compile(r"# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+")
SERIES = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})?')

def series(text):
    if not text.endswith("\n"):
        return None
    found = set()
    for line in text[:-1].split("\n"):
        if COMMENT.fullmatch(line):
            continue
        name, _space, value = line.rpartition(" ")
        try:
            float(value)
        except ValueError:
            return None
        if not SERIES.fullmatch(name):
            return None
        found.add(name)
    return found

def rewrite():
    for _run in range(count):
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)

writer = threading.Thread(target=rewrite)
with open(path) as handle:
    first = series(handle.read())
reads, versions, bad = 0, set(), []
writer.start()
while writer.is_alive():
    with open(path) as handle:
        text = handle.read()
    reads += 1
    versions.add(hashlib.sha1(text.encode()).hexdigest())
    found = series(text)
    if first is None or found is None or not found >= first:
        bad.append(text)
writer.join()
print(json.dumps({"reads": reads, "versions": len(versions), "series": len(first or ()), "bad": bad[:3]}))
"""
REWRITES = 30


def test_every_read_of_a_metrics_file_is_whole_while_runs_rewrite_it(host):
    """A reader (node_exporter's textfile collector) must never see half a
    file: it reads healthy's file as fast as it can, while 30 runs of healthy
    rewrite it one after another (each run's ExecStopPost= writes it).
    Host after host: the reader keeps a core busy."""
    out = host.check_output("python3 -c %s %s %s systemctl start batchq-healthy.service", READ_WHILE_REWRITTEN,
                            "/var/lib/prometheus/node-exporter/batchq-healthy.prom", str(REWRITES))
    seen = json.loads(out)
    assert seen["bad"] == [] and seen["series"] >= 10, seen
    # the reads overlapped the rewrites: each run wrote a version of its own, read many times over
    assert seen["versions"] >= REWRITES / 2 and seen["reads"] >= 10 * seen["versions"], seen
    figure("%s: %d whole reads of healthy's metrics file while %d runs rewrote it (%d versions read)"
           % (host.backend.get_hostname(), seen["reads"], REWRITES, seen["versions"]))


def test_the_paused_gauge_tells_a_paused_consumer_from_a_stalled_one(host):
    """dormant is deployed with state: paused (the alert rule leaves it alone);
    every other consumer says 0."""
    series = scrape(host)
    paused = {dict(labels)["consumer"]: value for (metric, labels), value in series.items()
              if metric == "batchq_consumer_paused"}
    assert paused.pop("dormant") == 1, paused
    assert paused and set(paused.values()) == {0}, paused
    assert "healthy" in paused
