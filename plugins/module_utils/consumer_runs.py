# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs of consumers, from `systemctl show` and journal JSON.

Pure functions that take command output as text and return dicts; the
consumer_info module runs the commands. Every run is told apart by its
invocation ID, so the log lines of a run are its own.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_spec import parse_timespan

__metaclass__ = type

# Manager messages about a run (systemd's catalog; SYSTEMD_FACTS.md §14).
JOB_STARTED = "7d4958e842da4a758f6c1cdc7b36dcc5"
JOB_DONE = "39f53479d3a045ac8e11786248231fbf"
JOB_FAILED = "be02cf6855d2428ba40df7e9d022f03d"
PROCESS_EXITED = "98e322203f7a4ed290d09fe03c09fe15"
UNIT_FAILED = "d9b373ed55a64feb8242e02dbe79a49c"
UNIT_SUCCEEDED = "7ad2d189f7e94e70a38c781354912448"
RUN_MESSAGES = (JOB_STARTED, JOB_DONE, JOB_FAILED, PROCESS_EXITED, UNIT_FAILED, UNIT_SUCCEEDED)

SERVICE_PROPERTIES = ("Id", "LoadState", "ActiveState", "Result", "InvocationID", "ExecMainCode",
                      "ExecMainStatus", "ExecMainStartTimestamp", "ExecMainExitTimestamp")
TIMER_PROPERTIES = ("Id", "LoadState", "ActiveState", "UnitFileState", "LastTriggerUSec",
                    "NextElapseUSecMonotonic", "NextElapseUSecRealtime")

# waitid()'s si_code as systemctl prints ExecMainCode, and systemd's names for it.
EXIT_CODES = {"1": "exited", "2": "killed", "3": "dumped"}
SIGNALS = {1: "HUP", 2: "INT", 3: "QUIT", 4: "ILL", 5: "TRAP", 6: "ABRT", 7: "BUS", 8: "FPE", 9: "KILL",
           10: "USR1", 11: "SEGV", 12: "USR2", 13: "PIPE", 14: "ALRM", 15: "TERM", 24: "XCPU", 25: "XFSZ", 31: "SYS"}

_UNIT_RE = r"^%s(?P<name>[a-z0-9][a-z0-9_-]*)(?P<instance>@[^.]*)?\.(?P<kind>service|timer)$"


def parse_show(text):
    """`systemctl show` of several units: {Id: {property: value}}."""
    units = {}
    for block in re.split(r"\n\s*\n", text.strip()):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if fields.get("Id"):
            units[fields["Id"]] = fields
    return units


def parse_timestamp(text):
    """Seconds since the epoch of systemd's 'Sun 2026-11-29 11:58:26.123456 UTC', or None."""
    text = (text or "").strip()
    if text in ("", "n/a", "0"):
        return None
    words = text.split()
    if len(words) != 4 or words[3] != "UTC":
        raise ValueError("not a UTC timestamp: %r" % text)
    stamp = "%s %s" % (words[1], words[2] if "." in words[2] else words[2] + ".0")
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()


def iso(seconds):
    """ISO 8601 in UTC, or None."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def consumer_units(text, prefix):
    """Consumer keys and their units from `systemctl list-units`/`list-unit-files` lines.

    Returns {key: {"service": unit, "timer": unit}} with key `name` or `name@N`;
    a template with no loaded instance is reported under its bare name.
    """
    unit_re = re.compile(_UNIT_RE % re.escape(prefix))
    found, templates = {}, set()
    for line in text.splitlines():
        words = line.split()
        match = unit_re.match(words[0]) if words else None
        if not match:
            continue
        instance = match.group("instance")
        if instance == "@":
            templates.add(match.group("name"))
            continue
        key = match.group("name") + (instance or "")
        found.setdefault(key, {})[match.group("kind")] = words[0]
    for name in templates:
        if not any(key.startswith(name + "@") for key in found):
            found[name] = {}
    for key, units in found.items():
        units.setdefault("service", prefix + key + ".service")
        units.setdefault("timer", prefix + key + ".timer")
    return found


def _exit_status(code, status):
    """A number for a process that exited, the signal's name for one killed or dumped."""
    if status is None or not str(status).isdigit():
        return status or None
    if code in ("killed", "dumped"):
        return SIGNALS.get(int(status), str(status))
    return int(status)


def parse_journal_runs(text):
    """Finished and started runs from the manager's JSON messages, newest first.

    Each run: invocation_id, started, finished, duration_s, result, exit_code,
    exit_status (missing pieces are None).
    """
    runs = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        invocation = entry.get("INVOCATION_ID")
        if not invocation:
            continue
        run = runs.setdefault(invocation, {"invocation_id": invocation, "started": None, "finished": None,
                                           "result": None, "exit_code": None, "exit_status": None})
        when = int(entry["__REALTIME_TIMESTAMP"]) / 1e6
        message = entry.get("MESSAGE_ID")
        if message == JOB_STARTED:
            run["started"] = when
        elif message in (JOB_DONE, JOB_FAILED):
            run["finished"] = when
        elif message == PROCESS_EXITED:
            run["exit_code"] = entry.get("EXIT_CODE")
            run["exit_status"] = _exit_status(run["exit_code"], entry.get("EXIT_STATUS"))
        elif message == UNIT_FAILED:
            run["result"] = entry.get("UNIT_RESULT")
        elif message == UNIT_SUCCEEDED:
            run["result"] = "success"
    for run in runs.values():
        if run["result"] == "success" and run["exit_code"] is None:
            run["exit_code"], run["exit_status"] = "exited", 0
        both = run["started"] is not None and run["finished"] is not None
        run["duration_s"] = round(run["finished"] - run["started"], 3) if both else None
    return sorted(runs.values(), key=lambda r: r["started"] or r["finished"] or 0, reverse=True)


def parse_journal_lines(text):
    """The MESSAGE of each JSON journal entry, oldest first."""
    lines = []
    for line in text.splitlines():
        if line.strip():
            message = json.loads(line).get("MESSAGE")
            if isinstance(message, list):  # journald stores non-UTF-8 output as bytes
                message = bytes(message).decode("utf-8", "replace")
            lines.append(message)
    return lines


def last_run_from_show(service):
    """The latest finished run as systemd itself describes it, or None."""
    started = parse_timestamp(service.get("ExecMainStartTimestamp"))
    finished = parse_timestamp(service.get("ExecMainExitTimestamp"))
    if started is None or finished is None or finished < started:
        return None
    code = EXIT_CODES.get(service.get("ExecMainCode", ""))
    return {
        "invocation_id": service.get("InvocationID") or None,
        "started": started,
        "finished": finished,
        "duration_s": round(finished - started, 3),
        "result": service.get("Result") or None,
        "exit_code": code,
        "exit_status": _exit_status(code, service.get("ExecMainStatus")),
    }


def _public(run):
    if run is None:
        return None
    result = dict(run)
    result["started"], result["finished"] = iso(run["started"]), iso(run["finished"])
    return result


def summarize(history):
    durations = [r["duration_s"] for r in history if r["duration_s"] is not None]
    failures = sum(1 for r in history if r["result"] != "success")
    return {
        "runs": len(history),
        "failures": failures,
        "success_rate": round((len(history) - failures) / len(history), 3) if history else None,
        "mean_duration_s": round(sum(durations) / len(durations), 3) if durations else None,
    }


def consumer_report(service, timer, journal_runs, log, history, now_realtime, now_monotonic):
    """One consumer's report and the warnings about it.

    service, timer: `systemctl show` dicts; journal_runs: parse_journal_runs()
    of its service; log: the last run's own lines; now_*: the host's clocks in
    seconds, to turn the timer's monotonic next elapse into a wall time.
    """
    warnings = []
    if service.get("LoadState") != "loaded":
        return {"state": "missing", "timer": None, "last_run": None, "running_since": None,
                "history": [], "summary": summarize([])}, warnings
    running = service.get("ActiveState") in ("activating", "deactivating", "reloading")
    finished = [r for r in journal_runs if r["finished"] is not None]
    last = None
    if not running:
        last = last_run_from_show(service)
        if last is not None:
            if not any(r["invocation_id"] == last["invocation_id"] for r in finished):
                warnings.append("the journal has lost run %s of %s; reporting what systemd knows"
                                % (last["invocation_id"], service["Id"]))
    elif finished:
        last = dict(finished[0])
    if last is not None:
        last = _public(last)
        last["log"] = log
    running_since = parse_timestamp(service.get("ExecMainStartTimestamp")) if running else None

    timer_active = timer.get("ActiveState") == "active"
    if running:
        state = "running"
    elif not timer_active:
        state = "paused"
    elif last is not None and last["result"] != "success":
        state = "failed"
    else:
        state = "waiting"

    next_run = None
    monotonic = timer.get("NextElapseUSecMonotonic", "")
    if timer_active and monotonic not in ("", "infinity", "0"):
        next_run = iso(now_realtime + parse_timespan(monotonic) - now_monotonic)
    elif timer_active:
        next_run = iso(parse_timestamp(timer.get("NextElapseUSecRealtime")))
    past = [_public(r) for r in finished[:history]]
    return {
        "state": state,
        "timer": {
            "enabled": timer.get("UnitFileState") == "enabled",
            "active": timer_active,
            "last_trigger": iso(parse_timestamp(timer.get("LastTriggerUSec"))),
            "next_run": next_run,
        },
        "last_run": last,
        "running_since": iso(running_since),
        "history": past,
        "summary": summarize(finished[:history]),
    }, warnings
