# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each consumer's runtime spec: what the host-side programs need to run it.

The planner makes one spec per consumer that runs a host-side program: the
drain runner (backlog_exit_code), the after-run writer (metrics, failure
hooks) or the slots of the host's budget (consumer_budget.running_max). The
role installs it as JSON beside those programs, root's and readable by all: it never holds a secret, only the paths systemd loads them
from. The unit files pass its path (--spec) and the unit's name (--unit %n);
the programs read everything else from it. A change to what they need is a
change here and in the program that reads it, not in a command line.

The time spans are in microseconds, as systemd counts them; 0 means none.
"""

from __future__ import annotations

import json

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_budget import host_budget
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_names import STATE_DIR

__metaclass__ = type

SPEC_VERSION = 1
# The folder of the specs, in the helpers' folder.
SPEC_FOLDER = "specs"
# What the scaler of a range of instances keeps (batchq_scale.py): root's,
# and gone at reboot, as the instances it woke are.
SCALE_FOLDER = "/run/batchq/scale"


def spec_path(helper_dir, prefix, name):
    """Where a consumer's spec lives on the host: <helpers>/specs/<prefix><name>.json."""
    return "%s/%s/%s%s.json" % (helper_dir, SPEC_FOLDER, prefix, name)


def metrics_folder(metrics_dir, prefix, name):
    """The folder a consumer's metrics file is written in (see consumer_metrics)."""
    return "%s/%s%s.d" % (metrics_dir, prefix, name)


def scale_spec(unit, settings):
    """What batchq-drain and batchq_scale.py need of a range of instances
    (consumer_spec's scale), or None for a fixed count.

    request: the file a drain writes to ask for one more instance, in its
    StateDirectory= (writable in the sandbox), which the consumer's path unit
    watches. status: the scaler's record of the instances it woke, which the
    drain reads. metrics_file: batchq_consumer_active_instances, beside the
    consumer's other textfiles."""
    if not unit["scale"]:
        return None
    stem = settings["prefix"] + unit["name"]
    return {"min": unit["scale"]["min"], "max": unit["scale"]["max"], "cooldown_usec": unit["scale"]["cooldown_usec"],
            "request": "%s/%s/scale-request" % (STATE_DIR, unit["name"]),
            "status": "%s/%s.json" % (SCALE_FOLDER, stem),
            "metrics_file": "%s/%s.scale.prom" % (settings["metrics_dir"], stem) if settings["metrics"] else None}


def runs_after_run(unit, metrics, runner):
    """Whether the unit's ExecStopPost= runs the after-run writer: for its failure
    hooks, or for its metrics when no runner writes them after each batch."""
    return bool(unit["hooks"]) or (bool(metrics) and not runner)


def running_max(settings):
    """consumer_budget.running_max of the plan's settings, or None (no cap, or a
    budget the plan refuses)."""
    return host_budget(settings.get("budget"))[0]["running_max"]


def waits_in_unit(settings, queued_starts):
    """Whether each consumer unit waits for a slot of the host's budget itself:
    a running cap, on a systemd whose slices cannot queue starts (before 258)."""
    return running_max(settings) is not None and not queued_starts


def runs_runner(unit, settings, queued_starts):
    """Whether the unit runs its batches through the runner (batchq-drain),
    which times each batch out itself: a drain, or a plain consumer whose
    start timeout would count its wait for a slot (waits_in_unit())."""
    return bool(unit["backlog_exit_code"]) or waits_in_unit(settings, queued_starts)


def has_spec(unit, settings):
    """Whether a consumer runs a host-side program, which reads its spec."""
    return (bool(unit["backlog_exit_code"]) or bool(unit["hooks"]) or bool(settings["metrics"])
            or running_max(settings) is not None)


def runtime_spec(unit, settings, encrypted, queued_starts=False):
    """The spec of a normalised consumer (consumer_spec), with the plan's
    settings, whether the host's systemd decrypts credentials and whether its
    slices queue starts (ConcurrencySoftMax=, 258)."""
    hook_credentials = unit["credentials"]["hook_credentials"] if unit["hooks"] else []
    return {
        "spec_version": SPEC_VERSION,
        "consumer": unit["name"],
        # the consumer's services now: the metrics of others (fewer instances) are dropped
        "services": unit["services"],
        "backlog_exit_code": unit["backlog_exit_code"],
        "timeout_usec": unit["timeout_usec"],
        "stop_timeout_usec": unit["stop_timeout_usec"],
        "interval_usec": unit["interval_usec"],
        "preload": unit["preload"],
        # instances as a range: how batchq-drain asks for one more, and batchq_scale.py wakes it
        "scale": scale_spec(unit, settings),
        "metrics_folder": metrics_folder(settings["metrics_dir"], settings["prefix"], unit["name"])
        if settings["metrics"] else None,
        "hooks": unit["hooks"],
        # the host's cap on the consumer units that run at once (batchq_slots.py)
        "running_max": running_max(settings),
        # whether the unit runs its batches through batchq-drain: the template asks this, never again
        "runner": runs_runner(unit, settings, queued_starts),
        # loaded into each hook's own unit: LoadCredentialEncrypted= or LoadCredential=
        "hook_credentials": {
            "encrypted": bool(encrypted),
            "load": ["%s:%s" % (entry["name"], entry["encrypted_path" if encrypted else "path"])
                     for entry in hook_credentials],
        } if hook_credentials else None,
    }


def spec_text(spec):
    """The spec's file: stable JSON, so that an unchanged spec is an unchanged file."""
    return json.dumps(spec, indent=1, sort_keys=True) + "\n"


def runtime_specs(units, settings, encrypted=False, queued_starts=False):
    """{name: {"path", "spec", "after_run"}} for the installed consumers that have a spec."""
    return {
        unit["name"]: {"path": spec_path(settings["helper_dir"], settings["prefix"], unit["name"]),
                       "spec": runtime_spec(unit, settings, encrypted, queued_starts),
                       "after_run": runs_after_run(unit, settings["metrics"],
                                                   runs_runner(unit, settings, queued_starts))}
        for unit in units if unit["state"] != "absent" and has_spec(unit, settings)
    }


def spec_files(specs, helper_dir):
    """The consumer_files entries that lay out the specs: their folder, then each file."""
    if not specs:
        return []
    root = {"owner": "root", "group": "root"}
    return [dict(root, path="%s/%s" % (helper_dir, SPEC_FOLDER), state="directory", mode="0755")] + [
        dict(root, path=entry["path"], state="file", mode="0644", content=spec_text(entry["spec"]))
        for _name, entry in sorted(specs.items())]


def stale_specs(found, specs, owners):
    """The spec files of found (the specs folder's files) that no consumer has any
    more: those of owners (the consumers listed, and those removed) that are not
    in specs. Another playbook's consumer's spec is left alone."""
    wanted = {entry["path"] for entry in specs.values()}
    stale = []
    for path in found:
        stem = path.rsplit("/", 1)[-1][:-len(".json")] if path.endswith(".json") else None
        if stem is not None and path not in wanted and any(stem == owner for owner in owners):
            stale.append(path)
    return sorted(stale)
