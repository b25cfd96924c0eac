# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The consumers deployed on a host, from its unit files alone.

Pure functions for the consumer_deployed module: consumer_control.yml acts on
what the role installed, never on an inventory it may not have.
"""

from __future__ import annotations

__metaclass__ = type

# The section of a consumer's timer file that the role writes for control
# (templates/consumer.timer.j2); systemd ignores sections named X-*.
SECTION = "X-Batchq"
# Oneshot states in which a batch (or its ExecStopPost=) still runs.
RUNNING_STATES = ("activating", "deactivating", "reloading")


def unit_file_sections(text):
    """{section: [(key, value), ...]} of a unit file, in order.

    Enough for the files the role writes: no line continuations, comments on
    lines of their own.
    """
    sections, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
        elif current is not None and "=" in line:
            key, value = line.split("=", 1)
            current.append((key.strip(), value.strip()))
    return sections


def _first(pairs, key, default):
    # The role writes its own settings before timer_options, which may repeat
    # them: the first is the one a deploy starts the timer with.
    return next((value for name, value in pairs if name == key), default)


def timer_settings(text):
    """What a resume needs from a consumer's timer file, and the role's record.

    Returns {"start_delay", "accuracy", "jitter", "instances" (int or None),
    "min_instances" (int, or None when they are not a range), "state",
    "metrics_dir" (or None)}. A file written before the role kept its
    record ([X-Batchq]) gives instances None, state "present" and no metrics_dir.
    """
    sections = unit_file_sections(text)
    timer = sections.get("Timer", [])
    record = dict(sections.get(SECTION, []))
    instances = record.get("Instances", "")
    least = record.get("MinInstances", "")
    return {
        # OnBootSec= is the consumer's start_delay (consumer.timer.j2)
        "start_delay": _first(timer, "OnBootSec", "0"),
        "accuracy": _first(timer, "AccuracySec", "1s"),
        "jitter": _first(timer, "RandomizedDelaySec", "0"),
        "instances": int(instances) if instances.isdigit() and int(instances) > 0 else None,
        "min_instances": int(least) if least.isdigit() and int(least) > 0 else None,
        "state": record.get("State", "present"),
        "metrics_dir": record.get("Metrics") or None,
    }


def read_timer_settings(path):
    """timer_settings() of the timer file at path, or None when it cannot be
    read. A byte that is not UTF-8 (a file edited by hand) is replaced."""
    try:
        with open(path, "rb") as handle:
            return timer_settings(handle.read().decode("utf-8", "replace"))
    except OSError:
        return None


def deployed_consumer(name, prefix, settings, loaded_instances):
    """One consumer's units and timer starts, or None when its instances are
    unknown (a paused template written before the record: nothing names them).

    loaded_instances: the instance numbers systemd has loaded, [] for a
    consumer without instances (settings from its plain timer file) or None.
    """
    unit = prefix + name
    count = settings["instances"]
    if loaded_instances is None:
        numbers, scheduled = None, 1
    elif count:
        # An instance above the count that systemd still has loaded: woken
        # before a deploy lowered max. A pause and a wait take it too.
        numbers = [str(i) for i in range(1, count + 1)] + sorted(
            (number for number in loaded_instances if number.isdigit() and int(number) > count), key=int)
        scheduled = count
    else:
        numbers = sorted(loaded_instances, key=_instance_order)
        scheduled = len(numbers)
    if numbers == []:
        return None
    timers = [unit + ".timer"] if numbers is None else ["%s@%s.timer" % (unit, number) for number in numbers]
    # Instances as a range: a resume and a run start those up to min; the
    # others wake with a backlog. A pause and a wait take all.
    scheduled = timers[:settings.get("min_instances") or scheduled]
    return {
        "name": name,
        "state": settings["state"],
        "instances": len(timers),
        "timers": timers,
        "services": [timer[:-len(".timer")] + ".service" for timer in timers],
        "scheduled_services": [timer[:-len(".timer")] + ".service" for timer in scheduled],
        "starts": [{"timer": timer, "delay": settings["start_delay"], "accuracy": settings["accuracy"],
                    "jitter": settings["jitter"]} for timer in scheduled],
        "metrics_dir": settings["metrics_dir"],
    }


def _instance_order(number):
    return (0, int(number), "") if number.isdigit() else (1, 0, number)


def select(found, names):
    """(the consumers to act on, the names not deployed here).

    names None: every consumer deployed with state present, as the role left
    it; a list: exactly those named, whatever the state they were deployed with.
    """
    if names is None:
        return [c for c in found if c["state"] == "present"], []
    by_name = {c["name"]: c for c in found}
    chosen = [by_name[name] for name in dict.fromkeys(names) if name in by_name]
    return chosen, [name for name in dict.fromkeys(names) if name not in by_name]


def running(show, services):
    """The services of parse_show() output that still run a batch."""
    return [s for s in services if show.get(s, {}).get("ActiveState") in RUNNING_STATES]
