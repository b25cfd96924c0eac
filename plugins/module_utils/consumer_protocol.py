# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a consumer's run and each batch of it end, written and read by the same code.

This is the run protocol, with the reader of each consumer's runtime spec
(made by module_utils/consumer_runtime.py on the controller). The host-side programs write it: the drain runner
(batchq-drain), the after-run writer and the metrics writer. The
consumer_info module reads it back. The role installs this file on each
host beside those programs (as consumer_protocol.py), so there is one copy.
Standard library only: it runs on the hosts' Python 3.9 and later.

The words for how a batch or a run ended are systemd's SERVICE_RESULT words
(systemd.exec(5), "Environment variables passed to ExecStop= and
ExecStopPost="), and one of ours: "backlog", a batch that succeeded and
left work waiting (it exited with the consumer's backlog_exit_code).

An exit status is a number for a process that exited, and a signal's name
without "SIG" for one a signal ended ("TERM"), as systemd prints EXIT_STATUS.
The metrics need a number: 128+N for signal N, as a shell says it.
"""

from __future__ import annotations

import calendar
import json
import re
import signal
import sys
import time

__metaclass__ = type

# MESSAGE_ID of the runner's record at the end of each batch.
BATCH_END = "4f3c5a1e9b6d4c0e8a2f7b9d1e3c5a70"
# MESSAGE_ID of the runner's first record of a run, written before any batch
# exists: its _PID names the runner once a newer run of the unit started.
RUN_START = "4ffa427f290f4ac7818066cbf936f167"
# The fields of BATCH_END besides MESSAGE, in the order readers ask for them.
BATCH_FIELDS = ("BATCHQ_BATCH", "BATCHQ_RESULT", "BATCHQ_EXIT_STATUS", "BATCHQ_STARTED_USEC",
                "BATCHQ_ENDED_USEC")
# SYSLOG_IDENTIFIER of the runner's own records; a batch's lines carry its program's.
RUNNER_IDENTIFIER = "batchq-drain"

# Results that count as a success: the metrics' last_run_success, the hooks' recovery.
SUCCESSES = ("success", "backlog")
# Every result a batch of a drain can have.
BATCH_RESULTS = ("success", "backlog", "exit-code", "signal", "timeout")

# "batch 12 ended: backlog 75 after 0.103s": the StatusText a drain's runner
# leaves on its unit after each batch. systemd keeps it until the next run.
STATUS_TEXT = "batch %d ended: %s %s after %.3fs"
_STATUS_TEXT_RE = re.compile(
    r"batch (?P<number>\d+) ended: (?P<result>[a-z-]+) (?P<status>[\w+]+) after (?P<duration>[\d.]+)s")


def signal_name(number):
    """A signal's name as systemd prints it: 15 -> "TERM", 35 -> "RTMIN+1"; one
    outside every range as its number."""
    if signal.SIGRTMIN < number <= signal.SIGRTMAX:
        return "RTMIN+%d" % (number - signal.SIGRTMIN)
    try:
        return signal.Signals(number).name[3:]
    except ValueError:
        return str(number)


def signal_number(name):
    """The number of a signal named as signal_name() names it, or None."""
    if name.startswith("RTMIN+") and name[6:].isdigit():
        return signal.SIGRTMIN + int(name[6:])
    member = getattr(signal.Signals, "SIG" + name, None)
    return member.value if member is not None else None


def exit_status(code, status):
    """EXIT_STATUS as the protocol says it, from systemd's EXIT_CODE and EXIT_STATUS
    (or ExecMainCode and ExecMainStatus): a number for a process that exited, a
    signal's name for one killed or dumped. None when systemd gave none."""
    if status is None or status == "":
        return None
    text = str(status)
    if not text.isdigit():
        return text
    if code in ("killed", "dumped"):
        return signal_name(int(text))
    return int(text)


def exit_status_number(status):
    """A status as the metrics give it: the number, or 128+N for signal N (a name or a number)."""
    if isinstance(status, int):
        return status
    text = str(status or "")
    if text.isdigit():
        return int(text)
    number = signal_number(text)
    return 128 + number if number is not None else 0


def batch_outcome(returncode, backlog, timed_out):
    """How a batch ended: (result, status) from its return code (negative: the
    signal that ended it), the consumer's backlog_exit_code and whether the
    runner ended it at its timeout."""
    status = signal_name(-returncode) if returncode < 0 else returncode
    if timed_out:
        return "timeout", status
    if returncode < 0:
        return "signal", status
    if returncode == backlog:
        return "backlog", status
    return ("success" if returncode == 0 else "exit-code"), status


def status_text(number, result, status, seconds):
    """The StatusText of a batch's end."""
    return STATUS_TEXT % (number, result, status, seconds)


def parse_status_text(text):
    """The batch a StatusText of status_text() tells of: number, result,
    exit_status and duration_s; None for any other text."""
    match = _STATUS_TEXT_RE.fullmatch((text or "").strip())
    if not match:
        return None
    status = match.group("status")
    return {"number": int(match.group("number")), "result": match.group("result"),
            "exit_status": int(status) if status.isdigit() else status,
            "duration_s": round(float(match.group("duration")), 3)}


# MESSAGE_ID of the record of a start that waited for a slot of the host's
# budget (consumer_budget.running_max), with the wait in BATCHQ_SLOT_WAIT_USEC.
SLOT_WAIT = "8a6b1f0c2d9e4b7a9c3e5f1a2b4c6d80"
# The StatusText of a unit that waits for a slot (systemd before 258, where
# the unit itself waits): "waiting for a slot since 2026-12-07 10:04:05 UTC, 2 of 2 taken".
SLOT_STATUS_TEXT = "waiting for a slot since %s, %d of %d taken"
_SLOT_STATUS_TEXT_RE = re.compile(
    r"waiting for a slot since (?P<since>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC, (?P<taken>\d+) of (?P<slots>\d+) taken")


def slot_status_text(since, taken, slots):
    """The StatusText of a unit that waits for a slot since `since` (time.time())."""
    return SLOT_STATUS_TEXT % (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)), taken, slots)


def parse_slot_status(text):
    """since (seconds since the epoch), taken and slots of a StatusText of
    slot_status_text(); None for any other text."""
    match = _SLOT_STATUS_TEXT_RE.fullmatch((text or "").strip())
    if not match:
        return None
    since = calendar.timegm(time.strptime(match.group("since"), "%Y-%m-%d %H:%M:%S"))
    return {"since": since, "taken": int(match.group("taken")), "slots": int(match.group("slots"))}


def slot_wait_fields(seconds):
    """The journal fields of the record of a start that waited `seconds` for a slot."""
    return {"MESSAGE": "waited %.3fs for a slot of the host's budget" % seconds, "MESSAGE_ID": SLOT_WAIT,
            "PRIORITY": 6, "BATCHQ_SLOT_WAIT_USEC": int(seconds * 1e6), "SYSLOG_IDENTIFIER": "batchq-slots"}


def batch_end_fields(number, result, status, started, ended, identifier):
    """The journal fields of the runner's record at a batch's end. started and
    ended are time.time() values; identifier is the SYSLOG_IDENTIFIER of the
    batch's own lines."""
    return {
        "MESSAGE": status_text(number, result, status, ended - started),
        "MESSAGE_ID": BATCH_END, "PRIORITY": 6 if result in SUCCESSES else 4,
        "BATCHQ_BATCH": number, "BATCHQ_RESULT": result, "BATCHQ_EXIT_STATUS": status,
        "BATCHQ_STARTED_USEC": int(started * 1e6), "BATCHQ_ENDED_USEC": int(ended * 1e6),
        "BATCHQ_LOG_IDENTIFIER": identifier, "SYSLOG_IDENTIFIER": RUNNER_IDENTIFIER,
    }


def parse_batch_end(entry):
    """The batch a BATCH_END record tells of (a dict of journal fields): number,
    started, finished (seconds), duration_s, result and exit_status."""
    started, ended = int(entry["BATCHQ_STARTED_USEC"]) / 1e6, int(entry["BATCHQ_ENDED_USEC"]) / 1e6
    status = entry.get("BATCHQ_EXIT_STATUS")
    return {
        "number": int(entry["BATCHQ_BATCH"]),
        "started": started,
        "finished": ended,
        "duration_s": round(ended - started, 3),
        "result": entry.get("BATCHQ_RESULT"),
        "exit_status": int(status) if str(status).isdigit() else status,
    }


def batch_journal_matches(main_pid, status):
    """The journal matches, besides the run's invocation, of the lines of a
    drain's last batch: relayed by its runner (main_pid, a field journald sets
    and no batch can forge), numbered by it (status, from parse_status_text)."""
    return ["_PID=%s" % main_pid, "BATCHQ_BATCH=%d" % status["number"]]


def parse_show(text):
    """`systemctl show` of several units: {Id: {property: value}}."""
    units = {}
    for block in re.split(r"\n\s*\n", text.strip()):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if fields.get("Id"):
            units[fields["Id"]] = fields
    return units


# How often a drain asks for one more instance at most (seconds), and how long
# the scaler's word that no instance may wake now holds (all are awake, or one
# it woke still waits for its first batch): a drain then asks no more for a
# while, and a wait for a slot does not run the scaler once a second per drain.
ASK_EVERY = 1.0
NO_WAKE_TRUSTED = 5.0


def ask_for_instance(scale, unit, asked_at, clock=time.monotonic, wall=time.time):
    """A drain's request for one more instance of a range (batchq_scale.py):
    unit's name in the spec's scale request file, which the consumer's path
    unit watches. Not within ASK_EVERY of its last request (asked_at, on
    clock), nor while the scaler's status, written within NO_WAKE_TRUSTED,
    says that no instance may wake. Returns when it asked (asked_at when it
    did not); never fails the drain."""
    now = clock()
    if asked_at is not None and now - asked_at < ASK_EVERY:
        return asked_at
    try:
        with open(scale["status"], encoding="utf-8") as handle:
            status = json.load(handle)
        if (status["awake"] >= status["max"] or status["pending"]) and 0 <= wall() - status["written"] < NO_WAKE_TRUSTED:
            return asked_at
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no record yet: ask
    try:
        with open(scale["request"], "w", encoding="utf-8") as handle:
            handle.write(unit + "\n")
    except OSError as exc:
        sys.stderr.write("batchq-drain: cannot ask for one more instance: %s\n" % exc)
    return now


# The runtime spec's version and fields, with the types the programs rely on
# (consumer_runtime.runtime_spec() writes them).
SPEC_VERSION = 1
SPEC_FIELDS = {
    "consumer": str, "services": list, "backlog_exit_code": (int, type(None)), "timeout_usec": int,
    "stop_timeout_usec": int, "interval_usec": int, "preload": list, "metrics_folder": (str, type(None)),
    "hooks": (dict, type(None)), "hook_credentials": (dict, type(None)),
}
# Fields a spec written by an earlier release of the role lacks, with the value they then have:
# another unit prefix's consumers keep their specs until their own deploy. runner: whether the
# unit runs its batches through batchq-drain (a drain, or a plain consumer that waits for a slot).
SPEC_DEFAULTS = {"running_max": None, "runner": None, "scale": None}
SPEC_OPTIONAL = {"running_max": (int, type(None)), "runner": (bool, type(None)), "scale": (dict, type(None))}


class SpecError(ValueError):
    """A runtime spec that cannot be read or lacks a field: its message names the file and the field."""


def read_spec(path):
    """A consumer's runtime spec, from the JSON file the role installed."""
    try:
        with open(path, encoding="utf-8") as handle:
            spec = json.load(handle)
    except (OSError, ValueError) as exc:
        raise SpecError("runtime spec %s: cannot be read: %s" % (path, exc)) from None
    if not isinstance(spec, dict) or spec.get("spec_version") != SPEC_VERSION:
        raise SpecError("runtime spec %s: spec_version is not %d (a deploy of this collection writes it)"
                        % (path, SPEC_VERSION))
    for field, kind in SPEC_FIELDS.items():
        if field not in spec:
            raise SpecError("runtime spec %s: no field %s" % (path, field))
        if not isinstance(spec[field], kind) or isinstance(spec[field], bool):
            raise SpecError("runtime spec %s: field %s is %s" % (path, field, json.dumps(spec[field])))
    for field, kind in SPEC_OPTIONAL.items():
        spec.setdefault(field, SPEC_DEFAULTS[field])
        if not isinstance(spec[field], kind) or (isinstance(spec[field], bool) and bool not in kind):
            raise SpecError("runtime spec %s: field %s is %s" % (path, field, json.dumps(spec[field])))
    if spec["runner"] is None:  # before the field: the drains alone ran through the runner
        spec["runner"] = spec["backlog_exit_code"] is not None
    return spec
