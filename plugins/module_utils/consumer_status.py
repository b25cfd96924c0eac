# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet status table and its monitoring verdicts, from consumer_info reports."""

from __future__ import annotations

from datetime import datetime

__metaclass__ = type

COLUMNS = ("host", "consumer", "state", "last result", "last run", "duration", "next run", "failures")


def _seconds(iso_text):
    return datetime.fromisoformat(iso_text.replace("Z", "+00:00")).timestamp() if iso_text else None


def _age(seconds):
    if seconds is None:
        return "never"
    seconds = int(max(seconds, 0))
    for limit, size, unit in ((120, 1, "s"), (7200, 60, "m"), (172800, 3600, "h")):
        if seconds < limit:
            return "%d%s ago" % (seconds // size, unit)
    return "%dd ago" % (seconds // 86400)


def rows(reports, now):
    """One row of strings per consumer: reports is {host: consumer_info's consumers}."""
    table = []
    for host in sorted(reports):
        for key, consumer in sorted(reports[host].items()):
            last = consumer.get("last_run") or {}
            timer = consumer.get("timer") or {}
            finished = _seconds(last.get("finished"))
            summary = consumer.get("summary") or {}
            table.append((
                host, key, consumer["state"],
                last.get("result") or "-",
                _age(now - finished if finished is not None else None),
                "%.1fs" % last["duration_s"] if last.get("duration_s") is not None else "-",
                (timer.get("next_run") or "-").replace("T", " ")[:19],
                "%s/%s" % (summary.get("failures", 0), summary.get("runs", 0)),
            ))
    return table


def table(reports, now):
    """The fleet as aligned text lines, header first."""
    lines = [COLUMNS] + rows(reports, now)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(COLUMNS))]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines]


def problems(reports, now, fail_on_failed=False, max_age=None):
    """What a monitoring check should fail on, one sentence each."""
    found = []
    for host in sorted(reports):
        for key, consumer in sorted(reports[host].items()):
            last = consumer.get("last_run") or {}
            if fail_on_failed and consumer["state"] in ("failed", "missing"):
                found.append("%s on %s: %s (last result %s)" % (key, host, consumer["state"], last.get("result")))
            elif fail_on_failed and consumer["state"] == "stopped":
                # not paused by the role, yet nothing will start it: as bad as failing
                found.append("%s on %s: stopped (timer enabled but inactive or failed, last result %s)"
                             % (key, host, last.get("result")))
            # Only the role's pause, a batch in flight and an instance of a range that sleeps (no
            # backlog) excuse a consumer for not finishing runs.
            if max_age is not None and consumer["state"] not in ("paused", "running", "dormant"):
                finished = _seconds(last.get("finished"))
                if finished is None or now - finished > max_age:
                    found.append("%s on %s: no run ended in the last %gs" % (key, host, max_age))
    return found
