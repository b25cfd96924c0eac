# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host's budget (consumer_budget): one slice holds every consumer of the
host, with caps for all of them together.

The caps are the slice's CPUQuota=, MemoryMax= and TasksMax=, and
running_max: how many consumer batches run at once. A unit that runs counts
as one batch: a drain holds its slot from its first batch to its last. On
systemd 258 and later the slice holds a start back itself
(ConcurrencySoftMax=: the start job waits in systemd's queue; none is lost).
Older systemd has no such setting: each consumer's unit then waits for a slot
first (batchq_slots.py, ExecStartPre=), and gives it back when it stops.
"""

from __future__ import annotations

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_spec import CPU_QUOTA_RE, MEMORY_RE

__metaclass__ = type

# The keys of consumer_budget, each with the slice setting it becomes.
SLICE_SETTINGS = {"cpu_quota": "CPUQuota", "memory_max": "MemoryMax", "tasks_max": "TasksMax"}
KEYS = tuple(SLICE_SETTINGS) + ("running_max",)
# The highest running_max: a host that runs more batches at once needs no cap.
RUNNING_MAX_LIMIT = 1000


def _whole_number(value, lowest, highest):
    """value as an int between lowest and highest, or None."""
    if isinstance(value, bool):
        return None
    try:
        number = int(str(value))
    except ValueError:
        return None
    return number if lowest <= number <= highest else None


def host_budget(raw):
    """consumer_budget checked: ({key: value or None}, [problem, ...]). Each
    problem names the key at fault."""
    budget = dict.fromkeys(KEYS)
    if raw is None or raw == {}:
        return budget, []
    if not isinstance(raw, dict):
        return budget, ["consumer_budget: must be a dict with keys of %s, got %r" % (", ".join(KEYS), raw)]
    problems = ["consumer_budget: unknown key %r (known: %s)" % (key, ", ".join(KEYS))
                for key in sorted(map(str, raw)) if key not in KEYS]
    for key in KEYS:
        value = raw.get(key)
        if value is None:
            continue
        if key == "cpu_quota" and not CPU_QUOTA_RE.fullmatch(str(value)):
            problems.append("consumer_budget.cpu_quota: must be a percentage such as '150%%', got %r" % (value,))
        elif key == "memory_max" and not MEMORY_RE.fullmatch(str(value)):
            problems.append("consumer_budget.memory_max: must be bytes with an optional K, M, G or T suffix,"
                            " a percentage or 'infinity', got %r" % (value,))
        elif key == "tasks_max" and str(value) != "infinity" and _whole_number(value, 1, 4194304) is None:
            problems.append("consumer_budget.tasks_max: must be a whole number from 1 to 4194304 or 'infinity',"
                            " got %r" % (value,))
        elif key == "running_max" and _whole_number(value, 1, RUNNING_MAX_LIMIT) is None:
            problems.append("consumer_budget.running_max: must be a whole number from 1 to %d, got %r"
                            % (RUNNING_MAX_LIMIT, value))
        elif key in ("tasks_max", "running_max") and str(value) != "infinity":
            budget[key] = int(str(value))
        else:
            budget[key] = str(value)
    return budget, problems


def slice_settings(budget, queues_starts):
    """The [Slice] settings of the budget, in order: [(setting, value)].
    queues_starts: whether the host's systemd has ConcurrencySoftMax= (258)."""
    settings = [(setting, budget[key]) for key, setting in SLICE_SETTINGS.items() if budget[key] is not None]
    if budget["running_max"] is not None and queues_starts:
        settings.append(("ConcurrencySoftMax", budget["running_max"]))
    return settings
