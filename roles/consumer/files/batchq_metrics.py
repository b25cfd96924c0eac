# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A consumer's Prometheus metrics after each batch (node_exporter's textfile collector).

update() is called after every run by batchq_after_run.py (the unit's
ExecStopPost=), and after every batch of a drain by batchq-drain;
add_slot_wait() by batchq_slots.py, when a run got its slot of the host's
budget (consumer_budget.running_max).

The file FOLDER/metrics.prom (FOLDER is <dir>/<unit prefix><name>.d, owned
by the consumer's user so that a drain can write it from its sandbox; the
role links <dir>/<unit prefix><name>.prom to it) holds the series of every unit of the
consumer (its instances). Its counters are read back from it before each
write: the file in /var/lib is the counter's state, so it survives reboots
and re-deploys. Written to a temporary file in the same folder, then renamed:
node_exporter never reads half a file. The callers never let an error here
fail a batch.
"""

import fcntl
import os
import re
import time

import consumer_protocol as protocol

PREFIX = "batchq_consumer_"
# name: (type, help); the order of the file
METRICS = {
    "last_run_start_timestamp_seconds": ("gauge", "Start of the consumer's last batch."),
    "last_run_end_timestamp_seconds": ("gauge", "End of the consumer's last batch."),
    "last_run_duration_seconds": ("gauge", "Duration of the consumer's last batch."),
    "last_run_success": ("gauge", "1 if the last batch succeeded (exit 0 or backlog_exit_code), else 0."),
    "last_success_timestamp_seconds": ("gauge", "End of the last batch that succeeded."),
    "last_exit_status": ("gauge", "Exit status of the last batch; 128+N if killed by signal N."),
    "consecutive_failures": ("gauge", "Batches that failed in a row, up to the last one (0 after a success)."),
    "runs_total": ("counter", "Batches by result (systemd's words; backlog: succeeded, more work waits)."),
    "interval_seconds": ("gauge", "The consumer's interval (OnUnitInactiveSec=)."),
    "timeout_seconds": ("gauge", "The consumer's timeout per batch (+Inf: none)."),
    "slot_wait_seconds_total": ("counter", "Seconds the consumer's starts waited for a slot of the host's budget."),
}
# runs_total of these results is there from a unit's first batch on, at 0:
# increase() and rate() miss the first count of a series that starts at 1.
COUNTED_FROM_ZERO = ("success", "exit-code", "signal", "timeout")
# Longest wait for another instance's write; then this batch's is left out.
LOCK_WAIT = 5.0
SERIES_RE = re.compile(r'^%s(?P<metric>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$' % PREFIX)
LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """{(metric, unit, result or ""): value} of the series of a file written by render()."""
    series = {}
    for line in text.splitlines():
        match = SERIES_RE.match(line)
        if not match or match.group("metric") not in METRICS:
            continue
        labels = dict(LABEL_RE.findall(match.group("labels")))
        try:
            series[(match.group("metric"), labels.get("unit", ""), labels.get("result", ""))] = float(
                match.group("value"))
        except ValueError:
            continue
    return series


def record(series, unit, run, interval, timeout, units=()):
    """series updated with one finished batch: run has result, status, started, ended.
    units: the consumer's units now; the series of others (fewer instances
    than before, or none) are dropped, or alerts would see them for ever."""
    new = {key: value for key, value in series.items() if not units or key[1] in units}
    for result in COUNTED_FROM_ZERO:
        new.setdefault(("runs_total", unit, result), 0)
    ok = run["result"] in protocol.SUCCESSES
    new[("last_run_start_timestamp_seconds", unit, "")] = run["started"]
    new[("last_run_end_timestamp_seconds", unit, "")] = run["ended"]
    new[("last_run_duration_seconds", unit, "")] = max(0.0, run["ended"] - run["started"])
    new[("last_run_success", unit, "")] = 1 if ok else 0
    new[("last_exit_status", unit, "")] = run["status"]
    if ok:
        new[("last_success_timestamp_seconds", unit, "")] = run["ended"]
    failures = new.get(("consecutive_failures", unit, ""), 0)
    new[("consecutive_failures", unit, "")] = 0 if ok else failures + 1
    key = ("runs_total", unit, run["result"])
    new[key] = new.get(key, 0) + 1
    new[("interval_seconds", unit, "")] = interval
    new[("timeout_seconds", unit, "")] = timeout if timeout > 0 else float("inf")
    return new


def _value(number):
    if number == float("inf"):
        return "+Inf"
    return repr(int(number)) if float(number).is_integer() else repr(float(number))


def render(consumer, series):
    """The text of the file: HELP and TYPE once per metric, no timestamps."""
    lines = []
    for metric, (kind, text) in METRICS.items():
        rows = sorted(key for key in series if key[0] == metric)
        if not rows:
            continue
        lines += ["# HELP %s%s %s" % (PREFIX, metric, text), "# TYPE %s%s %s" % (PREFIX, metric, kind)]
        for key in rows:
            labels = 'consumer="%s",unit="%s"' % (consumer, key[1])
            if key[2]:
                labels += ',result="%s"' % key[2]
            lines.append("%s%s{%s} %s" % (PREFIX, metric, labels, _value(series[key])))
    return "\n".join(lines) + "\n"


def lock(descriptor, wait):
    """flock(LOCK_EX), waiting at most `wait` seconds: a writer never holds a batch up."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError("%ss waiting for another writer" % wait) from None
            time.sleep(0.01)


def update(folder, consumer, unit, run, interval, timeout, units=()):
    """Add one finished batch to FOLDER/metrics.prom, atomically and durably
    (the file holds the counters: a power cut must not empty it)."""
    rewrite(folder, consumer, lambda series: record(series, unit, run, interval, timeout, units))


def add_slot_wait(folder, consumer, unit, seconds):
    """Add a start's wait for a slot to FOLDER/metrics.prom."""
    key = ("slot_wait_seconds_total", unit, "")
    rewrite(folder, consumer, lambda series: {**series, key: series.get(key, 0) + round(seconds, 6)})


def rewrite(folder, consumer, change):
    """FOLDER/metrics.prom with its series changed by change(series), written
    atomically and durably."""
    target = os.path.join(folder, "metrics.prom")
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # Instances of one consumer share the file: one writer at a time.
        lock(folder_fd, LOCK_WAIT)
        try:
            with open(target, encoding="utf-8") as handle:
                series = parse(handle.read())
        except FileNotFoundError:
            series = {}
        text = render(consumer, change(series))
        # One name will do: the lock makes this the only writer. The folder
        # is the consumer's user's, and this may run as root: a file of that
        # name is removed first, and the new one is made here (O_EXCL), never
        # followed (O_NOFOLLOW). Not tempfile: importing it takes about 7 ms,
        # and this runs after every run.
        temporary = os.path.join(folder, ".metrics.prom.tmp")
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(handle, text.encode("utf-8"))
            # node_exporter reads it as its own user; the sandbox's umask is 0077.
            os.fchmod(handle, 0o644)
            os.fsync(handle)
        finally:
            os.close(handle)
        os.rename(temporary, target)
        os.fsync(folder_fd)  # the folder: the rename itself
    finally:
        os.close(folder_fd)
