# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The slots of the host's budget: at most consumer_budget.running_max
consumer units run at once, and the wait for a slot is reported.

Usage, as root, outside the sandbox (the unit's ExecStartPre=+ and ExecStopPost=+):
    batchq_slots.py --spec SPEC_PATH --unit UNIT take     (systemd before 258)
    batchq_slots.py --spec SPEC_PATH --unit UNIT give     (systemd before 258)
    batchq_slots.py --spec SPEC_PATH --unit UNIT waited   (systemd 258 and later)

On systemd 258 and later, batchq.slice holds a start back itself
(ConcurrencySoftMax=): `waited` only measures how long the start waited,
from the timer's elapse. Older systemd has no such cap, so `take` waits
until one of the spec's running_max slots is free, then holds it until
`give`, which runs when the unit stops, however it stops. A unit waits in
its start-pre state, with its StatusText saying since when
(consumer_protocol.slot_status_text). Such a unit has no start timeout: its
batches run through the drain runner (batchq-drain), which times each batch
out from the batch's own start, so the wait never counts against the
consumer's timeout, even across a daemon-reload (which re-arms a start
timeout from the start of the wait). The first unit to wait is the first to
get a slot; a deploy that changes running_max counts from the waiters' next look.

The slots are files in /run/batchq/slots, which a reboot empties: held/UNIT
holds the invocation ID of the run that holds a slot, waiting/UNIT that of a
run that waits, and the time it came. A file whose run is over (its unit's
invocation changed, or it is not active) is stale: a holder that was killed
before `give` frees its slot within LIVENESS_EVERY.

A wait of MIN_REPORTED or more is written to the journal (MESSAGE_ID
consumer_protocol.SLOT_WAIT, field BATCHQ_SLOT_WAIT_USEC), and every wait is
added to the consumer's batchq_consumer_slot_wait_seconds_total.
"""

import fcntl
import os
import re
import subprocess
import sys
import time

# The helpers installed beside this file: it runs isolated (python3 -I).
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import batchq_journal  # noqa: E402 pylint: disable=wrong-import-position
import consumer_protocol as protocol  # noqa: E402 pylint: disable=wrong-import-position

FOLDER = "/run/batchq/slots"
POLL = 0.25  # seconds between two looks at the slots while a unit waits
LIVENESS_EVERY = 1.0  # seconds between two checks of the holders' runs with systemd
MIN_REPORTED = 0.1  # seconds: a shorter wait is counted in the metrics, not written to the journal
C_ENV = {"LANG": "C", "LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
LIVE_STATES = ("activating", "active", "deactivating", "reloading")


def read_entries(folder):
    """{unit: [field, ...]} of the files of a slots folder (held or waiting)."""
    entries = {}
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return entries
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                entries[name] = handle.read().split()
        except (FileNotFoundError, UnicodeDecodeError):
            continue
    return entries


def first_in_line(waiting, unit):
    """Whether unit came first of the waiting units ({unit: [invocation, since]}):
    a unit that does not wait yet comes after all that do. Ties go by name."""
    def place(name):
        fields = waiting[name]
        return (float(fields[1]) if len(fields) > 1 else 0.0, name)
    if unit not in waiting:
        return not waiting
    return min(waiting, key=place) == unit


def may_take(held, waiting, unit, slots):
    """Whether unit takes a slot now: one is free, and no unit came before it.
    A slot held by unit itself is a stale one of its earlier run."""
    others = [name for name in held if name != unit]
    return len(others) < slots and first_in_line(waiting, unit)


def live_runs(units):
    """{unit: invocation ID} of those of units that run now."""
    if not units:
        return {}
    output = subprocess.run(["systemctl", "show", "--property=Id", "--property=InvocationID",
                             "--property=ActiveState", "--"] + sorted(units),
                            stdout=subprocess.PIPE, check=True, env=C_ENV, timeout=10).stdout.decode("utf-8", "replace")
    return {name: fields.get("InvocationID", "") for name, fields in protocol.parse_show(output).items()
            if fields.get("ActiveState") in LIVE_STATES}


def stale(entries, live):
    """The units of entries ({unit: [invocation, ...]}) whose run is over."""
    return [name for name, fields in entries.items() if not fields or live.get(name) != fields[0]]


class Slots:
    """The slots folder, one reader or writer at a time (flock on its lock file)."""

    def __init__(self, folder=FOLDER):
        self.folder = folder
        for part in ("held", "waiting"):
            os.makedirs(os.path.join(folder, part), mode=0o755, exist_ok=True)
        self.lock = os.open(os.path.join(folder, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def __enter__(self):
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.lock, fcntl.LOCK_UN)

    def entries(self, part):
        return read_entries(os.path.join(self.folder, part))

    def put(self, part, unit, fields):
        path = os.path.join(self.folder, part, unit)
        with open(path + ".new", "w", encoding="utf-8") as handle:
            handle.write(" ".join(fields) + "\n")
        os.rename(path + ".new", path)

    def drop(self, part, unit):
        try:
            os.unlink(os.path.join(self.folder, part, unit))
        except FileNotFoundError:
            pass


def take(slots, unit, invocation, cap, live=live_runs, clock=time.monotonic, sleep=time.sleep,
         notify=batchq_journal.notify):
    """Wait until unit may take a slot, take it, and return the seconds waited.
    cap(): running_max as the spec says now (a deploy may change it while
    units wait), None when there is no cap any more."""
    began, wall = clock(), time.time()
    checked = None
    while True:
        running_max = cap()
        if running_max is None:
            break
        with slots:
            held, waiting = slots.entries("held"), slots.entries("waiting")
            others = [name for name in list(held) + list(waiting) if name != unit]
            full = len([name for name in held if name != unit]) >= running_max
            if others and (full or not first_in_line(waiting, unit)) and (
                    checked is None or clock() - checked >= LIVENESS_EVERY):
                try:
                    runs = live(others)
                except (OSError, subprocess.SubprocessError) as exc:
                    sys.stderr.write("batchq_slots: the runs holding slots unknown: %s\n" % exc)
                    runs = {name: (held.get(name) or waiting.get(name) or [""])[0] for name in others}
                for part, entries in (("held", held), ("waiting", waiting)):
                    for name in stale({k: v for k, v in entries.items() if k != unit}, runs):
                        slots.drop(part, name)
                        entries.pop(name)
                checked = clock()
            if may_take(held, waiting, unit, running_max):
                slots.put("held", unit, [invocation])
                slots.drop("waiting", unit)
                break
            if unit not in waiting:
                slots.put("waiting", unit, [invocation, "%.6f" % clock()])
            taken = len([name for name in held if name != unit])
        notify("STATUS=" + protocol.slot_status_text(wall, taken, running_max))
        sleep(POLL)
    waited = clock() - began
    notify("STATUS=")
    return waited


def give(slots, unit, invocation):
    """Give back the slot of this run of unit, and leave the line if it still waits."""
    with slots:
        for part in ("held", "waiting"):
            fields = slots.entries(part).get(unit)
            if fields and fields[0] == invocation:
                slots.drop(part, unit)


# The units of a time span as systemctl prints one (format_timespan()), in microseconds.
SPAN_UNITS = {"y": 31557600e6, "month": 2629800e6, "w": 604800e6, "d": 86400e6, "h": 3600e6, "min": 60e6,
              "s": 1e6, "ms": 1e3, "us": 1.0}
SPAN_RE = re.compile(r"([0-9.]+)(y|month|w|d|h|min|s|ms|us)\b")


def span_usec(text):
    """Microseconds of a time span as systemctl prints one: "10h 4min 28.895612s" (a timer's
    LastTriggerUSecMonotonic), or of a number of microseconds ("36268900352"); 0 for none."""
    text = (text or "").strip()
    if text.isdigit():
        return int(text)
    return int(round(sum(float(number) * SPAN_UNITS[unit] for number, unit in SPAN_RE.findall(text))))


def queue_wait(service, timer):
    """The seconds a start of the service waited in systemd's queue: from its
    timer's elapse to the service's start, when the timer started this run
    (it elapsed after the previous run ended). service and timer: their
    `systemctl show` properties. None for a run something else started."""
    started = span_usec(service.get("InactiveExitTimestampMonotonic"))
    previous_end = span_usec(service.get("InactiveEnterTimestampMonotonic"))
    triggered = span_usec(timer.get("LastTriggerUSecMonotonic"))
    if not triggered or triggered < previous_end or started < triggered:
        return None
    return (started - triggered) / 1e6


def waited_in_queue(unit):
    """queue_wait() of unit, from systemd."""
    timer = unit[:-len(".service")] + ".timer"
    output = subprocess.run(["systemctl", "show", "--property=Id", "--property=InactiveExitTimestampMonotonic",
                             "--property=InactiveEnterTimestampMonotonic", "--property=LastTriggerUSecMonotonic",
                             "--", unit, timer],
                            stdout=subprocess.PIPE, check=True, env=C_ENV, timeout=10).stdout.decode("utf-8", "replace")
    shown = protocol.parse_show(output)
    return queue_wait(shown.get(unit, {}), shown.get(timer, {}))


def report(spec, unit, seconds):
    """The wait in the journal (if it is MIN_REPORTED or more) and in the metrics."""
    if seconds >= MIN_REPORTED:
        batchq_journal.Journal().send(protocol.slot_wait_fields(seconds))
    if spec["metrics_folder"]:
        import batchq_metrics  # pylint: disable=import-outside-toplevel
        batchq_metrics.add_slot_wait(spec["metrics_folder"], spec["consumer"], unit, seconds)


def main(args):
    if len(args) != 5 or args[0] != "--spec" or args[2] != "--unit" or args[4] not in ("take", "give", "waited"):
        sys.stderr.write("usage: batchq_slots.py --spec SPEC_PATH --unit UNIT take|give|waited\n")
        return 2
    unit, action = args[3], args[4]
    invocation = os.environ.get("INVOCATION_ID", "")
    if action == "give":  # whatever became of the spec: a slot is always given back
        give(Slots(), unit, invocation)
        return 0
    spec = protocol.read_spec(args[1])
    if action == "take":
        # The unit has no start timeout (TimeoutStartSec=infinity): its runner
        # times each batch out from the batch's own start, however long this waits.
        seconds = take(Slots(), unit, invocation, lambda: protocol.read_spec(args[1])["running_max"])
    else:
        seconds = waited_in_queue(unit)
        if seconds is None:
            return 0
    try:
        report(spec, unit, seconds)
    except Exception as exc:  # pylint: disable=broad-except
        sys.stderr.write("batchq_slots: the wait of %s not reported: %s\n" % (unit, exc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
