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
from datetime import datetime, timezone

from ansible_collections.batchq.consumers.plugins.module_utils import consumer_protocol as protocol
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_names import starter_unit, unit_re
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_spec import parse_timespan

__metaclass__ = type

# Manager messages about a run (systemd's catalog, catalog/systemd.catalog.in; sd-messages.h).
JOB_STARTED = "7d4958e842da4a758f6c1cdc7b36dcc5"
JOB_DONE = "39f53479d3a045ac8e11786248231fbf"
JOB_FAILED = "be02cf6855d2428ba40df7e9d022f03d"
PROCESS_EXITED = "98e322203f7a4ed290d09fe03c09fe15"
UNIT_FAILED = "d9b373ed55a64feb8242e02dbe79a49c"
UNIT_SUCCEEDED = "7ad2d189f7e94e70a38c781354912448"
RUN_MESSAGES = (JOB_STARTED, JOB_DONE, JOB_FAILED, PROCESS_EXITED, UNIT_FAILED, UNIT_SUCCEEDED)

SERVICE_PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Job", "Result", "InvocationID", "ExecMainCode",
                      "ExecMainStatus", "ExecMainStartTimestamp", "ExecMainExitTimestamp",
                      "InactiveExitTimestamp", "StateChangeTimestamp", "ExecStart", "ExecMainPID", "StatusText")
# What the slice of the host's budget says of its running cap (systemd 258 and later).
SLICE_PROPERTIES = ("ConcurrencySoftMax", "NCurrentlyActive")
# systemd's "no limit" for ConcurrencySoftMax=: UINT32_MAX
NO_CONCURRENCY_LIMIT = 4294967295
TIMER_PROPERTIES = ("Id", "LoadState", "ActiveState", "UnitFileState", "LastTriggerUSec",
                    "NextElapseUSecMonotonic", "NextElapseUSecRealtime")

# waitid()'s si_code as systemctl prints ExecMainCode, and systemd's names for it.
EXIT_CODES = {"1": "exited", "2": "killed", "3": "dumped"}


def monotonic_twins(properties):
    """The CLOCK_MONOTONIC twin of each timestamp property, e.g. ExecMainStartTimestampMonotonic.
    (A timer's LastTriggerUSecMonotonic is printed as a time span, "12h 20min 37.386257s": not used.)"""
    return [name + "Monotonic" for name in properties if name.endswith("Timestamp")]


def precise_timestamps(units, now, monotonic_now):
    """Fill in the microseconds of the timestamps of parse_show's units.

    systemd before 248 ignores `--timestamp=us+utc` in `show` and prints whole
    seconds (a run of 0.4 s would last 1 s or none); the monotonic twin of each
    timestamp, taken at the same instant, gives them, on the clock pair
    (time.time(), time.monotonic()) read together on the host.
    """
    for fields in units.values():
        for name, text in list(fields.items()):
            twin = fields.get(name + "Monotonic", "0")
            if not name.endswith("Timestamp") or text in ("", "n/a") or "." in text or not twin.isdigit() or twin == "0":
                continue
            seconds = now - (monotonic_now - int(twin) / 1e6)
            fields[name] = datetime.fromtimestamp(seconds, timezone.utc).strftime("%a %Y-%m-%d %H:%M:%S.%f UTC")
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

    Returns {key: {"service": unit, "timer": unit, "starter": unit}} with key
    `name` or `name@N`. A template with no loaded instance is reported under
    its bare name with "template" set to its timer's unit file state: systemd
    lets go of instances that are stopped and disabled (a paused consumer), and
    keeps nothing that names them, so they cannot be listed one by one.
    """
    consumer_re = unit_re(prefix)
    found, templates = {}, {}
    for line in text.splitlines():
        words = line.split()
        match = consumer_re.match(words[0]) if words else None
        if not match or match.group("dropin"):
            continue
        if match.group("at") and not match.group("instance"):
            # list-unit-files: UNIT FILE-STATE PRESET; the service template is "static"
            if match.group("kind") == "timer":
                templates[match.group("name")] = words[1] if len(words) > 1 else ""
            else:
                templates.setdefault(match.group("name"), "")
            continue
        key = match.group("name") + (match.group("at") or "")
        found.setdefault(key, {})[match.group("kind")] = words[0]
    for name, file_state in templates.items():
        if not any(key.startswith(name + "@") for key in found):
            found[name] = {"service": prefix + name + "@.service", "timer": prefix + name + "@.timer",
                           "template": file_state}
    for key, units in found.items():
        if "template" not in units:  # starters exist for instances, never for a template
            units.setdefault("service", prefix + key + ".service")
            units.setdefault("timer", prefix + key + ".timer")
            units["starter"] = starter_unit(units["timer"])
    return found


def with_instances(found, name, prefix, most):
    """found (consumer_units()) with every instance of a consumer, 1 to
    most, in place of its bare template: systemctl lists no instance that
    systemd has let go of (a paused one, or a dormant one never woken since
    boot)."""
    found = {key: units for key, units in found.items() if key != name}
    for number in range(1, most + 1):
        key = "%s@%d" % (name, number)
        if key not in found:
            found[key] = {"service": "%s%s.service" % (prefix, key), "timer": "%s%s.timer" % (prefix, key),
                          "starter": starter_unit("%s%s.timer" % (prefix, key))}
    return found


def dormant(reports, name, least):
    """reports ({key: report}) with the instances of a range above least that
    sleep shown as "dormant": their timer is stopped and disabled, as the
    scaler leaves it, while the consumer is not paused (its first instance is
    not). A timer that failed, or that is enabled, stays "stopped"."""
    first = reports.get(name + "@1")
    if first is None or first["state"] == "paused":
        return reports
    for key, report in reports.items():
        number = key[len(name) + 1:] if key.startswith(name + "@") else ""
        if number.isdigit() and int(number) > least and report["state"] == "paused":
            report["state"] = "dormant"
    return reports


def template_show(units):
    """`systemctl show`-like dicts for a template without instances.

    systemctl refuses to show a template; what is known of it is that no
    instance is loaded, so none runs and no timer of it is armed.
    """
    service = {"Id": units["service"], "LoadState": "loaded", "ActiveState": "inactive"}
    timer = {"Id": units["timer"], "LoadState": "loaded", "ActiveState": "inactive",
             "UnitFileState": units["template"]}
    return service, timer


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
        # when the manager said it, not when journald (lagging on a loaded host) took it in
        when = int(entry.get("_SOURCE_REALTIME_TIMESTAMP") or entry["__REALTIME_TIMESTAMP"]) / 1e6
        message = entry.get("MESSAGE_ID")
        if message == JOB_STARTED:
            run["started"] = when
        elif message in (JOB_DONE, JOB_FAILED):
            run["finished"] = when
        elif message == PROCESS_EXITED:
            run["exit_code"] = entry.get("EXIT_CODE")
            run["exit_status"] = protocol.exit_status(run["exit_code"], entry.get("EXIT_STATUS"))
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


def group_journal(text, field):
    """The lines of journalctl's JSON output grouped by one field: {value: [line, ...]}, each in output order."""
    groups = {}
    for line in text.splitlines():
        if line.strip():
            groups.setdefault(json.loads(line).get(field), []).append(line)
    return groups


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
    """The latest finished run as systemd itself describes it, or None.

    ExecMain* describe the last main process, which need not be the last run's:
    a start that fails before exec (missing environment file) has none. They
    are taken only when that process ended after the run's activation began.
    """
    invocation = service.get("InvocationID") or None
    result = service.get("Result") or None
    started = parse_timestamp(service.get("ExecMainStartTimestamp"))
    finished = parse_timestamp(service.get("ExecMainExitTimestamp"))
    activated = parse_timestamp(service.get("InactiveExitTimestamp"))
    if started is not None and finished is not None and started <= finished \
            and (activated is None or finished >= activated):
        code = EXIT_CODES.get(service.get("ExecMainCode", ""))
        return {
            "invocation_id": invocation,
            "started": started,
            "finished": finished,
            "duration_s": round(finished - started, 3),
            "result": result,
            "exit_code": code,
            "exit_status": protocol.exit_status(code, service.get("ExecMainStatus")),
        }
    if invocation is None or service.get("ActiveState") not in ("inactive", "failed"):
        return None
    # A run without a process of its own: all systemd still knows is when it ended.
    return {"invocation_id": invocation, "started": None, "finished": parse_timestamp(service.get("StateChangeTimestamp")),
            "duration_s": None, "result": result, "exit_code": None, "exit_status": None}


def last_run(service, journal_runs):
    """The latest finished run of a service that is not running, and whether the journal lost it.

    The run is the one of the service's InvocationID. The journal's record of
    that invocation is its own by construction; ExecMain* times replace the
    journal's job times only when the process ended after that job began, so
    two runs are never mixed.
    """
    shown = last_run_from_show(service)
    invocation = service.get("InvocationID") or None
    journal = next((r for r in journal_runs if invocation and r["invocation_id"] == invocation
                    and r["finished"] is not None), None)
    if journal is None:
        if invocation is None:
            # systemd let go of the unit (no timer held it) and forgot its runs: the journal remembers
            done = [r for r in journal_runs if r["finished"] is not None]
            return (dict(done[0]) if done else None), False
        return shown, shown is not None
    run = dict(journal)
    run["result"] = service.get("Result") or run["result"]
    if shown is not None and shown["started"] is not None and journal["started"] is not None \
            and shown["finished"] >= journal["started"]:
        for field in ("started", "finished", "duration_s", "exit_code", "exit_status"):
            run[field] = shown[field]
    return run, False


def is_drain(service):
    """Whether the service runs its batches back to back through batchq-drain."""
    return "batchq-drain" in service.get("ExecStart", "")


def parse_batch_end(text):
    """The last batch of a drain from batchq-drain's newest end record (journal JSON), or None.

    Returns number (batches the run had), started, finished (seconds),
    duration_s, result (success, backlog, exit-code, signal, timeout) and exit_status.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    return protocol.parse_batch_end(json.loads(lines[0])) if lines else None


def parse_runner(text):
    """The PID of a drain run's runner from its start records (journal JSON,
    oldest first), or 0. The first is the runner's: it is written before the
    run has a batch, so no other process of the run could have written one before it."""
    for line in text.splitlines():
        if line.strip():
            pid = json.loads(line).get("_PID", "")
            return int(pid) if str(pid).isdigit() else 0
    return 0


def parse_batch_status(text):
    """The last batch of a drain from the StatusText batchq-drain leaves on its
    unit ("batch 12 ended: backlog 75 after 0.103s"), or None. systemd keeps it
    until the next run starts, and only the runner can set it: the batch count
    and result hold even when the journal dropped the end record."""
    batch = protocol.parse_status_text(text)
    return dict(batch, started=None, finished=None) if batch else None


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


def waits_for_slot(service, budget_slice=None):
    """Whether a start of the service waits for a slot of the host's budget
    (consumer_budget.running_max). budget_slice: `systemctl show` of batchq.slice.

    Before systemd 258 the unit waits itself, in its start-pre state, and its
    StatusText says so (consumer_protocol.slot_status_text). From 258 on, its
    start job waits in systemd's queue while the slice runs as many units as
    its ConcurrencySoftMax= allows."""
    if service.get("ActiveState") == "activating" and service.get("SubState") == "start-pre":
        return protocol.parse_slot_status(service.get("StatusText")) is not None
    if service.get("ActiveState") not in ("inactive", "failed") or not service.get("Job"):
        return False
    try:
        cap = int((budget_slice or {}).get("ConcurrencySoftMax") or NO_CONCURRENCY_LIMIT)
        active = int((budget_slice or {}).get("NCurrentlyActive") or 0)
    except ValueError:
        return False
    return cap < NO_CONCURRENCY_LIMIT and active >= cap


def consumer_report(service, timer, journal_runs, log, history, now_realtime, now_monotonic, starter=None,
                    budget_slice=None):
    """One consumer's report and the warnings about it.

    service, timer, starter, budget_slice: `systemctl show` dicts (starter: the
    transient timer that arms the consumer's timer, see consumer_names.starter_unit;
    budget_slice: batchq.slice, see waits_for_slot());
    journal_runs: parse_journal_runs() of its service; log: the last run's own
    lines; now_*: the host's clocks in seconds, to turn a monotonic next elapse
    into a wall time.
    """
    warnings = []
    if service.get("LoadState") != "loaded":
        return {"state": "missing", "timer": None, "last_run": None, "running_since": None,
                "history": [], "summary": summarize([])}, warnings
    slot_wait = waits_for_slot(service, budget_slice)
    # a run in progress, or one that waits for a slot in its start-pre state
    active = service.get("ActiveState") in ("activating", "deactivating", "reloading")
    running = active and not slot_wait
    finished = [r for r in journal_runs if r["finished"] is not None]
    last = None
    if not active:
        last, lost = last_run(service, journal_runs)
        if lost:
            warnings.append("the journal has lost run %s of %s; reporting what systemd knows"
                            % (last["invocation_id"], service["Id"]))
    elif finished:
        last = dict(finished[0])
    if last is not None:
        last = _public(last)
        last["log"] = log
    running_since = parse_timestamp(service.get("ExecMainStartTimestamp")) if running else None

    timer_active = timer.get("ActiveState") == "active"
    # The role arms a timer through a transient starter timer after start_delay:
    # until it fires, the consumer's own timer is inactive but on its way.
    starting = not timer_active and (starter or {}).get("ActiveState") == "active"
    enabled = timer.get("UnitFileState") in ("enabled", "enabled-runtime")
    if slot_wait:
        state = "waiting-for-slot"  # a start the host's budget holds back: not a failure
    elif running:
        state = "running"
    elif timer_active or starting:
        state = "failed" if last is not None and last["result"] != "success" else "waiting"
    elif timer.get("UnitFileState") == "disabled" and timer.get("ActiveState") == "inactive":
        state = "paused"  # how the role pauses a consumer: stopped and disabled
    else:
        state = "stopped"  # enabled (or masked) but stopped by hand, or failed: nothing will run it

    armed = starter if starting else timer if timer_active else {}
    next_run = None
    monotonic = armed.get("NextElapseUSecMonotonic", "")
    if monotonic not in ("", "infinity", "0"):
        next_run = iso(now_realtime + parse_timespan(monotonic) - now_monotonic)
    elif armed:
        next_run = iso(parse_timestamp(armed.get("NextElapseUSecRealtime")))
    past = [_public(r) for r in finished[:history]]
    return {
        "state": state,
        "timer": {
            "enabled": enabled,
            "active": timer_active,
            "last_trigger": iso(parse_timestamp(timer.get("LastTriggerUSec"))),
            "next_run": next_run,
        },
        "last_run": last,
        "running_since": iso(running_since),
        "history": past,
        "summary": summarize(finished[:history]),
    }, warnings
