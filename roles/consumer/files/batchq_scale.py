# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The instances of a consumer whose instances are a range ({min, max}):
one more wakes while a backlog lasts, and one above min sleeps once it is gone.

Usage, as root, outside the sandbox:
    batchq_scale.py --spec SPEC_PATH wake                (batchq.scale@.service)
    batchq_scale.py --spec SPEC_PATH --unit UNIT settle  (the consumer's ExecStopPost=-+)

The instances up to min are always scheduled. An instance above min is awake
while its timer is on, and dormant while it is off. A dormant timer is never
enabled, so a reboot brings the consumer back to min.

Waking: a drain that found more work in two batches in a row asks for one
more instance (consumer_protocol.ask_for_instance(), inside its sandbox): it writes
the spec's request file, in its StateDirectory=. The consumer's path unit
watches that file and starts batchq.scale@<prefix><name>.service, which runs
`wake`. That starts the timer and the service of the lowest dormant
instance, unless the consumer is paused, max instances are awake, or an
instance it woke has not begun its first batch yet: a start that waits (for
a slot of the host's budget) counts as started, so no more pile up behind it.

Sleeping: after each run, `settle` stops the timer of the run's instance
when the instance is above min, the run did not hand over to the next one
(it did not end with backlog_exit_code), and the instance has been awake
for the cooldown. A run that ends otherwise found the queue empty (exit 0)
or failed: either way, another instance does no good now. An instance above
max (max was lowered) sleeps at once.

The scaler's record, the spec's status file in /run/batchq/scale, holds when
it woke each instance (CLOCK_MONOTONIC, as systemd's timestamps), how many
are awake, whether one it woke still waits, and when it was written. The
drains read it so as not to ask while no instance may wake. With metrics on, the spec's metrics_file
gets batchq_consumer_active_instances, and batchq_consumer_dormant of each instance.
"""

import fcntl
import json
import os
import re
import subprocess
import sys
import time

# The helpers installed beside this file: it runs isolated (python3 -I).
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import consumer_protocol as protocol  # noqa: E402 pylint: disable=wrong-import-position

C_ENV = {"LANG": "C", "LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
ON = ("active", "activating")
INSTANCE_RE = re.compile(r"@([0-9]+)\.service\Z")


def instance_units(spec, number):
    """(timer, service) of instance number of the spec's consumer."""
    service = spec["services"][number - 1]
    return service[:-len(".service")] + ".timer", service


def look(spec):
    """{instance: {"timer": ActiveState, "service": ActiveState, "job": bool,
    "main_started": CLOCK_MONOTONIC µs of its last main process's start}} of
    instances 1 to max, in one systemctl call."""
    numbers = range(1, spec["scale"]["max"] + 1)
    units = [unit for number in numbers for unit in instance_units(spec, number)]
    output = subprocess.run(["systemctl", "show", "--property=Id,ActiveState,Job,ExecMainStartTimestampMonotonic",
                             "--"] + units, stdout=subprocess.PIPE, check=True, env=C_ENV, timeout=30).stdout
    shown = protocol.parse_show(output.decode("utf-8", "replace"))
    view = {}
    for number in numbers:
        timer, service = (shown.get(unit, {}) for unit in instance_units(spec, number))
        started = service.get("ExecMainStartTimestampMonotonic", "0")
        view[number] = {"timer": timer.get("ActiveState", ""), "service": service.get("ActiveState", ""),
                        "job": bool(service.get("Job")), "main_started": int(started) if started.isdigit() else 0}
    return view


def awake(view, least):
    """The instances that are awake: min always, others while their timer is on."""
    return [number for number, seen in sorted(view.items()) if number <= least or seen["timer"] in ON]


def pending(view, woken):
    """Whether an instance the scaler woke waits for its first batch: its
    start is queued or in its start-pre state (a slot of the host's budget),
    and its main process has not started since the wake."""
    return any(seen["timer"] in ON and (seen["job"] or seen["service"] == "activating")
               and seen["main_started"] < woken.get(str(number), -1)
               for number, seen in view.items())


def to_wake(view, scale, woken):
    """The instance to wake now, or None: the lowest dormant one, while the
    consumer is not paused (every instance up to min is on), fewer than max
    are awake and none woken still waits (pending())."""
    least = scale["min"]
    on = awake(view, least)
    if paused(view, least) or len(on) >= scale["max"] or pending(view, woken):
        return None
    return min(number for number in view if number not in on)


def paused(view, least):
    """Whether the consumer is paused: an instance up to min has its timer off."""
    return any(view[number]["timer"] not in ON for number in range(1, least + 1))


def sleeps(number, scale, ended, woken_at, now, is_paused=False):
    """Whether instance number goes dormant after its run: above max, or
    above min while the consumer is paused (a pause that came as it woke),
    always; above min when the run did not hand over (ended: (EXIT_CODE,
    EXIT_STATUS), as systemd gives them to ExecStopPost=) and it was awake for
    the cooldown (woken_at: CLOCK_MONOTONIC µs, None for an instance woken
    before the record: long ago)."""
    if number > scale["max"] or (is_paused and number > scale["min"]):
        return True
    if number <= scale["min"] or ended == ("exited", str(scale["backlog_exit_code"])):
        return False
    return woken_at is None or now - woken_at >= scale["cooldown_usec"]


class Record:
    """The scaler's status file, one reader or writer at a time (flock on a lock file beside it).
    A drain reads it too: it does not ask while the file says no instance may wake.

    woken: {instance: when the scaler woke it, CLOCK_MONOTONIC µs}; ran: the
    woken instances that ended a run since (the alert rules count on them
    from then on); looked: when a wake last looked, wall clock."""

    def __init__(self, path):
        self.path = path
        folder = os.path.dirname(path)
        os.makedirs(folder, mode=0o755, exist_ok=True)
        # drains read the status as their own user: the folder and its parent
        # (/run/batchq, which batchq_slots.py may have made) are open to read
        for made in (folder, os.path.dirname(folder)):
            os.chmod(made, 0o755)
        self.lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.woken, self.ran, self.looked = {}, set(), 0.0

    def __enter__(self):
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            with open(self.path, encoding="utf-8") as handle:
                status = json.load(handle)
            self.woken = {str(k): int(v) for k, v in status["woken"].items()}
            self.ran = {str(k) for k in status["ran"]}
            self.looked = float(status["looked"])
        except (OSError, ValueError, TypeError, AttributeError, KeyError):
            self.woken, self.ran, self.looked = {}, set(), 0.0
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.lock, fcntl.LOCK_UN)

    def write(self, view, scale):
        """The status after a change: when each awake instance was woken, how many are awake."""
        up = awake(view, scale["min"])
        self.woken = {number: at for number, at in self.woken.items() if int(number) in up}
        self.ran &= set(self.woken)
        status = {"woken": self.woken, "ran": sorted(self.ran), "looked": self.looked, "awake": len(up),
                  "min": scale["min"], "max": scale["max"], "pending": pending(view, self.woken),
                  "written": round(time.time(), 3)}
        replace(self.path, json.dumps(status, sort_keys=True) + "\n")

    def accountable(self, number, view, least):
        """Whether an instance should have succeeded lately: awake, and if woken, it ended a run since."""
        return number in awake(view, least) and (str(number) not in self.woken or str(number) in self.ran)


def replace(path, text):
    """Write path whole, by a rename: no reader sees half of it."""
    with open(path + ".new", "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path + ".new", 0o644)
    os.rename(path + ".new", path)


def write_metrics(spec, view, record):
    """batchq_consumer_active_instances and its bounds, and each instance's
    batchq_consumer_dormant, in the spec's metrics_file. For the alert rules,
    an instance is dormant while it sleeps, and after a wake until its first
    run ends: its last success until then is one from before it slept."""
    path = spec["scale"].get("metrics_file")
    if not path or not os.path.isdir(os.path.dirname(path)):
        return
    scale, consumer = spec["scale"], spec["consumer"]
    up = awake(view, scale["min"])
    lines = []
    for name, text, series in (
            ("active_instances", "Instances awake (timer on): min always, more while a backlog lasts.",
             [("", len(up))]),
            ("min_instances", "Instances always scheduled.", [("", scale["min"])]),
            ("max_instances", "The most instances a backlog wakes.", [("", scale["max"])]),
            ("dormant", "1 while the instance sleeps (its timer is off), and after a wake until its first run ends.",
             [(',unit="%s"' % instance_units(spec, number)[1], 0 if record.accountable(number, view, scale["min"]) else 1)
              for number in sorted(view)])):
        lines.append("# HELP batchq_consumer_%s %s\n# TYPE batchq_consumer_%s gauge\n" % (name, text, name))
        lines += ['batchq_consumer_%s{consumer="%s"%s} %d\n' % (name, consumer, unit, value) for unit, value in series]
    replace(path, "".join(lines))


def systemctl(*args):
    subprocess.run(("systemctl",) + args, check=True, env=C_ENV, timeout=30)


def wake(spec):
    """Wake one more instance if one may wake (to_wake())."""
    scale = spec["scale"]
    with Record(scale["status"]) as record:
        if 0 <= time.time() - record.looked < protocol.ASK_EVERY:
            return  # drains ask once a second at most: a request more often is no drain's
        record.looked = time.time()
        view = look(spec)
        number = to_wake(view, scale, record.woken)
        if number is not None:
            record.woken[str(number)] = int(time.monotonic() * 1e6)
            timer, service = instance_units(spec, number)
            # The timer schedules the runs from now on. A timer that already
            # ran since boot counts its next elapse from the instance's last
            # run, maybe an interval away: the service starts now, and waits
            # for a slot as any start does.
            systemctl("start", "--", timer)
            systemctl("start", "--no-block", "--", service)
            view[number].update(timer="active", job=True)
            print("instance %d woken: %d of at most %d awake" % (number, len(awake(view, scale["min"])), scale["max"]))
        record.write(view, scale)
        write_metrics(spec, view, record)


def settle(spec, unit):
    """After a run of unit: put its instance to sleep if it should (sleeps()),
    and any instance above max."""
    scale = dict(spec["scale"], backlog_exit_code=spec["backlog_exit_code"])
    match = INSTANCE_RE.search(unit)
    with Record(scale["status"]) as record:
        view = look(spec)
        ended = (os.environ.get("EXIT_CODE", ""), os.environ.get("EXIT_STATUS", ""))
        if match and sleeps(int(match.group(1)), scale, ended, record.woken.get(match.group(1)),
                            int(time.monotonic() * 1e6), paused(view, scale["min"])):
            number = int(match.group(1))
            timer = unit[:-len(".service")] + ".timer"
            # --no-block: this runs in the service's stop; the timer's stop job never waits on it
            systemctl("stop", "--no-block", "--", timer)
            if number in view:
                view[number]["timer"] = "inactive"
            print("instance %d dormant: its run ended (%s %s)" % (number, ended[0] or "no exit", ended[1] or ""))
        elif match and match.group(1) in record.woken:
            record.ran.add(match.group(1))
        record.write(view, scale)
        write_metrics(spec, view, record)


def main(args):
    usage = (len(args) == 3 and args[0] == "--spec" and args[2] == "wake") or (
        len(args) == 5 and args[0] == "--spec" and args[2] == "--unit" and args[4] == "settle")
    if not usage:
        sys.stderr.write("usage: batchq_scale.py --spec SPEC_PATH wake | --spec SPEC_PATH --unit UNIT settle\n")
        return 2
    try:
        spec = protocol.read_spec(args[1])
    except protocol.SpecError as exc:
        sys.stderr.write("batchq_scale: %s\n" % exc)
        return 2
    if not spec["scale"]:
        return 0  # a deploy made the instances a fixed count again
    # a unit's UMask= (0077 with hardening) holds for "+" commands too
    os.umask(0o022)
    if args[-1] == "wake":
        wake(spec)
    else:
        settle(spec, args[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
