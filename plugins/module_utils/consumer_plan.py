# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role's decisions, in one place: what to ask a host, and what to do
with its answers.

The role asks, plans, then applies: questions() says what to ask the host
(the consumer_preflight module asks it in one round trip), plan() turns the
answers into everything the role does, and the tasks only carry the plan out.
Both are pure functions of what the user gave and what the host answered, so
each decision is tested as a unit with the answers of real hosts
(tests/unit/test_consumer_plan.py).
"""

from __future__ import annotations

import json
import re

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_budget import host_budget, slice_settings
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_cleanup import leftovers, stale_secrets
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_layout import differs, sha256
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_metrics import metrics_files
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_names import CONTINUE_UNIT, SCALE_UNIT, SLICE_UNIT, unit_re
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_runtime import (
    SPEC_FOLDER,
    running_max,
    runs_runner,
    runtime_specs,
    waits_in_unit,
    spec_files,
    stale_specs,
)
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_spec import preload_pythons
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_systemd import systemd_support
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_unit_states import ON, starter_units, timer_changes

__metaclass__ = type

# Written into unit files as it is: no character systemd would read. \Z, not
# $: "$" also matches before a trailing newline.
METRICS_DIR_RE = re.compile(r"(/[A-Za-z0-9_.-]+)+\Z")
DOT_PART_RE = re.compile(r"/\.\.?(/|$)")

# The helpers a consumer needs on the host, copied from the role's files.
DRAIN_HELPERS = ("batchq-drain", "batchq_cpython.py", "batchq_journal.py", "batchq_main.py", "batchq_preload.py", "batchq_reseed.py", "batchq_supervise.py")
AFTER_RUN_HELPERS = ("batchq_metrics.py", "batchq_after_run.py")
# The slots of the host's budget (consumer_budget.running_max), which report
# each wait in the journal and the metrics.
SLOT_HELPERS = ("batchq_slots.py", "batchq_journal.py", "batchq_metrics.py")
# What every helper imports: the run protocol (a link in the role's files to
# module_utils/consumer_protocol.py, which consumer_info imports too).
SHARED_HELPERS = ("consumer_protocol.py",)
# Wakes and puts to sleep the instances of a range.
SCALE_HELPERS = ("batchq_scale.py",)
HELPERS = DRAIN_HELPERS + AFTER_RUN_HELPERS + ("batchq_slots.py",) + SCALE_HELPERS + SHARED_HELPERS


def _unique(values):
    """values without repeats, in the order first seen."""
    seen, kept = set(), []
    for value in values:
        if value not in seen:
            seen.add(value)
            kept.append(value)
    return kept


def installed(units):
    """The consumers whose units stay on the host: present or paused."""
    return [unit for unit in units if unit["state"] != "absent"]


def questions(units, account, settings=None):
    """What to ask the host about the normalised consumers (consumer_spec):
    the consumer_preflight module's options. Accounts by name, never by
    listing: see that module's documentation. With the plan's settings, also
    the states of the timers and of the files the plan wants: a deploy that
    changes nothing then skips the tasks that would change them."""
    kept = installed(units)
    asked = {}
    if settings is not None:
        asked = {"unit_states": [unit for timer in timers_to_set(units) for unit in switched_units(timer)],
                 "stat": [entry["path"] for entry in wanted_files(units, settings)]}
    return dict(asked, **{
        "spans": _unique(value for unit in units for value in unit["spans"].values()),
        "users": _unique([account] + [unit["user"] for unit in kept]),
        "groups": _unique([account] + [unit["group"] for unit in kept]),
        "paths": _unique(need["path"] for unit in kept for need in unit["required_paths"]),
        # the scripts of preloaded consumers: their #! line names the Python to run under
        "first_lines": _unique(unit["preload_script"] for unit in kept if unit["preload_script"]),
    })


def metrics_dir_problem(folder):
    """What is wrong with consumer_metrics_dir, or None when nothing is."""
    if METRICS_DIR_RE.match(str(folder)) and not DOT_PART_RE.search(str(folder)):
        return None
    return ("consumer_metrics_dir: must be an absolute path of letters, digits, '_', '.' and '-'"
            " without '.' or '..' parts, got %s" % json.dumps(folder))


def problems(units, answers, systemd, pythons, settings, host):
    """Every reason the host cannot run the consumers as given, each naming
    the consumer and the field at fault."""
    found = []
    if systemd["refusal"]:
        found.append(systemd["refusal"])
    metrics_dir = metrics_dir_problem(settings["metrics_dir"])
    if metrics_dir:
        found.append(metrics_dir)
    found += host_budget(settings.get("budget"))[1]
    found += pythons["problems"]
    for unit in units:
        for field, value in sorted(unit["spans"].items()):
            if value in answers["rejected_spans"]:
                found.append("systemd-analyze on %s rejects consumer '%s': field '%s': '%s' is not a systemd time span;"
                             % (host, unit["name"], field, value))
    account = settings["account"]
    private_run = not answers["credentials_shared"] and not systemd["features"]["credentials_private_run"]
    # the commands the units run before the main one, as root (ExecStartPre=+)
    slot_wait = waits_in_unit(settings, systemd["features"]["slice_concurrency"])
    for unit in installed(units):
        for field, database, existing in (("user", "passwd", answers["users"]), ("group", "group", answers["groups"])):
            if unit[field] != account and unit[field] not in existing:
                found.append("consumer '%s': field '%s': no %s entry %s on %s;"
                             % (unit["name"], field, database, unit[field], host))
        for field in ("credentials", "hook_credentials"):
            if unit["credentials"][field] and private_run:
                found.append(
                    "consumer '%s': field '%s': /run is a private mount on %s (as in a docker or podman container),"
                    " and systemd %s cannot pass credentials to a unit through it. Make /run shared at every boot"
                    " (mount --make-shared /run, as systemd does on a host), or give the values as secret_environment;"
                    % (unit["name"], field, host, systemd["version"]))
        before_start = [why for why, present in (
            ("the check of its environment files (secret_environment, environment_file)", unit["environment_check"]),
            ("the wait for a slot of consumer_budget.running_max", slot_wait),
            ("its own ExecStartPre= or ExecCondition= (service_options)",
             any(key in ("ExecStartPre", "ExecCondition") for key, _value in unit["service_options"]))) if present]
        if unit["credentials"]["credentials"] and before_start and not systemd["features"]["credentials_before_start"]:
            found.append(
                "consumer '%s': field 'credentials': systemd %s on %s cannot start a unit with credentials that runs"
                " a command before its batch (systemd 247 fails it; 252 is the first release known to work), and"
                " this one would run %s. Give its credentials as secret_environment instead, or deploy on systemd"
                " 252 or later;"
                % (unit["name"], systemd["version"], host, " and ".join(before_start)))
        for need in unit["required_paths"]:
            if need["path"] in answers["missing_paths"]:
                found.append("consumer '%s': field '%s': %s does not exist on %s;"
                             % (unit["name"], need["field"], need["path"], host))
    return found


def account_plan(units, answers, account):
    """Whether the role's account needs its group or user made: only when a
    consumer runs as it and it is not already as the role makes it."""
    user, group = answers["users"].get(account), answers["groups"].get(account)
    ready = (user is not None and group is not None and user["gid"] == group
             and user["home"] == "/var/lib/batchq" and user["shell"] == "/usr/sbin/nologin")
    kept = installed(units)
    runs_as = any(unit["user"] == account for unit in kept)
    in_group = runs_as or any(unit["group"] == account for unit in kept)
    return {"ready": ready, "make_group": not ready and in_group, "make_user": not ready and runs_as}


def other_shape(service_unit):
    """The service unit of a consumer's other shape: one instance or several."""
    if "@" in service_unit:
        return service_unit.replace("@.service", ".service")
    return service_unit.replace(".service", "@.service")


def timer_starts(units):
    """Each present consumer's scheduled timers, as consumer_units starts them:
    start_delay later, with its accuracy and jitter. Instances as a range:
    those up to min (the others wake with a backlog), and the path unit that
    wakes them, now, also while the consumer is paused (its scaler wakes none
    then), so that a resume needs nothing more."""
    return [{"consumer": unit["name"], "start": {"timer": timer, "delay": unit["spans"]["start_delay"],
                                                 "accuracy": unit["spans"]["accuracy"], "jitter": unit["spans"]["jitter"]}}
            for unit in units if unit["state"] == "present" for timer in unit["scheduled_timers"]] + [
        {"consumer": unit["name"], "start": {"timer": unit["scale"]["path_unit"], "delay": "0"}}
        for unit in installed(units) if unit["scale"]]


def dormant_timers(units):
    """The timers of present consumers that a backlog wakes, and a deploy never
    enables (a reboot brings the consumer back to min): those above min."""
    return [timer for unit in units if unit["state"] == "present"
            for timer in unit["timers"] if timer not in unit["scheduled_timers"]]


def helper_files(units, settings, queued_starts=False):
    """The helper programs the consumers need, and their folder; none when no
    consumer needs one. Each names its source in the role's files: the
    controller reads it as it lays the files out (consumer_file_texts).
    queued_starts: whether the host's slices queue starts (systemd 258)."""
    kept = installed(units)
    names = list(DRAIN_HELPERS) if any(runs_runner(unit, settings, queued_starts) for unit in kept) else []
    if kept and (settings["metrics"] or any(unit["hooks"] for unit in kept)):
        names += AFTER_RUN_HELPERS
    if kept and running_max(settings) is not None:
        names += SLOT_HELPERS
    if any(unit["scale"] for unit in kept):
        names += SCALE_HELPERS
    if not names:
        return []
    names = _unique(names + list(SHARED_HELPERS))
    helper_dir = settings["helper_dir"]
    root = {"owner": "root", "group": "root", "mode": "0755"}
    return [dict(root, path=helper_dir, state="directory")] + [
        dict(root, path="%s/%s" % (helper_dir, name), source=name) for name in names]


def wanted_files(units, settings, encrypted=False, queued_starts=False):
    """Every file and folder the consumers need laid out, in order: the
    helpers and the consumers' runtime specs, node_exporter's textfile folder
    (never taking a right away from a folder other exporters may share), then
    each consumer's metrics files; with metrics off, their removal
    (consumer_metrics says what and why). The paths never depend on
    encrypted (whether the host's systemd decrypts credentials): questions()
    asks about them before the host has said. Nor do they grow with
    queued_starts (whether its slices queue starts): without it, they are the
    most a host can need."""
    kept = installed(units)
    metrics = settings["metrics"]
    folder = [{"path": settings["metrics_dir"], "state": "directory", "mode": "a+rx"}] if metrics and kept else []
    return (helper_files(units, settings, queued_starts)
            + spec_files(runtime_specs(kept, settings, encrypted, queued_starts), settings["helper_dir"]) + folder
            + metrics_files(kept, settings["metrics_dir"], settings["prefix"], metrics))


def _ids(entry, answers):
    """The (uid, gid) of the entry's owner and group on the host, -1 for what
    it leaves alone; None when the host has no such account yet."""
    uid = group = -1
    if entry.get("owner"):
        uid = 0 if entry["owner"] == "root" else answers["users"].get(entry["owner"], {}).get("uid")
    if entry.get("group"):
        group = 0 if entry["group"] == "root" else answers["groups"].get(entry["group"])
    return None if uid is None or group is None else (uid, group)


def files_to_lay_out(files, answers, sources):
    """The entries of files that the host does not have as they are, by the
    consumer_preflight module's description of each path (answers["stat"]).
    An entry with a source compares its text by sources ({name: SHA-256})."""
    described = answers["stat"]
    differing = []
    for entry in files:
        if entry["path"] not in described or ("source" in entry and entry["source"] not in sources):
            differing.append(entry)
        elif differs(entry, described[entry["path"]], _ids(entry, answers), sources.get(entry.get("source"))):
            differing.append(entry)
    return differing


def switched_units(timer):
    """The timer and its scheduled start, whose states say whether the timer is on."""
    return [timer] + starter_units(timer)


def timers_to_set(units):
    """The timers whose state the role sets: those of present and paused
    consumers, and the path units of ranges of instances."""
    return [timer for unit in installed(units) for timer in unit["timers"]] + [
        unit["scale"]["path_unit"] for unit in installed(units) if unit["scale"]]


def timers_to_switch(start, stop, states, disable=()):
    """The timers of start, stop and disable that are not yet as the
    consumer_units module leaves them, by the states consumer_preflight
    reported (the module's own rule, timer_changes())."""
    def file_state(unit):
        return (states.get(unit) or {}).get("UnitFileState", "")

    def active(unit):
        return (states.get(unit) or {}).get("ActiveState", "") in ON

    to_enable, to_schedule, to_stop, to_disable = timer_changes([entry["timer"] for entry in start], stop, file_state,
                                                                active, disable)
    return _unique(to_enable + to_schedule + to_stop + to_disable)


def owned_stale_units(stale, kept, prefix):
    """The unit files of stale (consumer_preflight's stale_units) that are the
    units of consumers that stay, the drains' continuation unit, the slice
    of the host's budget or the scaler's unit: those the role has systemd load. A unit of the prefix the list does not name is
    someone else's (without consumer_exclusive), and its drain runs on."""
    owned = {prefix + unit["name"] for unit in kept}
    return [name for name in stale
            if name in (CONTINUE_UNIT, SLICE_UNIT, SCALE_UNIT) or re.sub(r"(@[^.]*)?\.[a-z]+\Z", "", name) in owned]


def with_texts(files, read):
    """The entries of files with each source replaced by its text, read(source)."""
    return [dict({k: v for k, v in entry.items() if k != "source"}, content=read(entry["source"]))
            if "source" in entry else entry for entry in files]


def metrics_left_behind(answers, settings, names):
    """The removal entries of the metrics files that the consumers of names
    have in a folder other than consumer_metrics_dir: the one the record in
    their timer file names (answers["metrics_dirs"]), which a deploy that
    moved the metrics left behind. node_exporter may still read that folder,
    and a file of a failing consumer there would keep its alert firing."""
    pattern = unit_re(settings["prefix"])
    entries = []
    for timer, folder in sorted(answers.get("metrics_dirs", {}).items()):
        match = pattern.match(timer)
        # a folder the role could not have written (a record edited by hand) is left alone
        if (folder and folder != settings["metrics_dir"] and metrics_dir_problem(folder) is None
                and match and match.group("name") in names):
            entries += metrics_files([match.group("name")], folder, settings["prefix"], enabled=False)
    return entries


def removal(units, answers, settings, encrypted):
    """What the host has that the consumers no longer want, from the units and
    secrets consumer_preflight found there (answers["found"]).

    The role removes it after it installs the wanted units: "stop" (timer
    globs), "drain" (services whose batches must end first), "absent" (the
    unit files, drop-ins and symlinks, with the secrets and hook state of the
    consumers that go away, in one step: a later failure leaves no secret of
    a consumer that is gone), "files" (their metrics files) and "removed"
    (the names of those consumers). Then "stale_secrets": the secret files of
    consumers that stay but no longer name them (or name the other form,
    encrypted or not), deleted once no unit names them.
    """
    found = answers["found"]
    left = leftovers(found.get(settings["unit_dir"], []), units, settings["prefix"], settings["exclusive"])
    secrets = found.get(settings["secrets_dir"], [])
    specs = found.get(specs_folder(settings), [])
    prefixed = [settings["prefix"] + name for name in left["removed"]]
    absent = (left["remove"] + stale_secrets(secrets, [], left["removed"]) + stale_specs(specs, {}, prefixed)
              + ["%s/%s.json" % (settings["hooks_state_dir"], name) for name in left["removed"]])
    return {
        "stop": left["stop"],
        "drain": left["drain"],
        "absent": absent,
        "files": (metrics_files(left["removed"], settings["metrics_dir"], settings["prefix"], enabled=False)
                  + metrics_left_behind(answers, settings, left["removed"])),
        "removed": left["removed"],
        "stale_secrets": [path for path in stale_secrets(secrets, units, (), encrypted) if path not in absent],
        # the specs of consumers that stay but run no host-side program now
        "stale_specs": [path for path in stale_specs(specs, runtime_specs(installed(units), settings),
                                                     [settings["prefix"] + unit["name"] for unit in units])
                        if path not in absent],
    }


def specs_folder(settings):
    """The folder of the runtime specs on the host, which consumer_preflight lists."""
    return "%s/%s" % (settings["helper_dir"], SPEC_FOLDER)


def plan(units, answers, settings, host="this host", sources=None):
    """What the role does on a host, from the normalised consumers and the
    consumer_preflight module's answers to questions().

    settings: account, prefix, exclusive (bool), metrics (bool), metrics_dir,
    helper_dir, unit_dir, secrets_dir and hooks_state_dir. sources: the
    SHA-256 of each helper's text ({name: digest}), to compare with the host's.
    """
    kept = installed(units)
    budget = host_budget(settings.get("budget"))[0]
    systemd = systemd_support(answers["systemctl_version"], host)
    encrypted = systemd["features"]["credentials_encrypted"]
    queued = systemd["features"]["slice_concurrency"]
    pythons = preload_pythons(kept, answers["first_lines"], host)
    # Present consumers whose units change shape (one instance to several, or
    # back): the host still has the other shape's service. Their timers start
    # only once the old shape's batch has ended, so that a consumer never
    # runs two batches at once.
    reshaped = [unit["name"] for unit in units
                if unit["state"] == "present" and other_shape(unit["service_unit"]) in answers["units"]]
    starts = timer_starts(units)
    start = [entry["start"] for entry in starts if entry["consumer"] not in reshaped]
    stop = [timer for unit in units if unit["state"] == "paused" for timer in unit["timers"]]
    disable = dormant_timers(units)
    return {
        # what the plan was made from, besides the host's answers (the templates read them too)
        "settings": settings,
        "installed": kept,
        "systemd": systemd,
        "pythons": pythons["pythons"],
        # {name: {path, spec, after_run}}: what the units pass the host-side programs
        "runtime": runtime_specs(kept, settings, encrypted, queued),
        # the host's budget, and the [Slice] settings of batchq.slice, which holds every consumer unit
        # waits_in_unit: each unit waits for a slot itself (consumer_runtime.waits_in_unit())
        "budget": dict(budget, waits_in_unit=waits_in_unit(settings, queued)),
        "slice": slice_settings(budget, queued),
        "problems": problems(units, answers, systemd, pythons, settings, host),
        "account": account_plan(units, answers, settings["account"]),
        "reshaped": reshaped,
        "start": start,
        "start_after_removal": [entry["start"] for entry in starts if entry["consumer"] in reshaped],
        "stop": stop,
        # the timers above min of ranges of instances: an awake one is left to go dormant itself
        "disable": disable,
        # The timers of start, stop and disable that are not as wanted yet, and
        # the unit files systemd has not loaded: with neither, and no unit file
        # to write, the role leaves the timers alone.
        "timers_to_switch": timers_to_switch(start, stop, answers["unit_states"], disable),
        "stale_units": owned_stale_units(answers["stale_units"], kept, settings["prefix"]),
        # The values never pass through the plan: the one task that writes them
        # reads them, and runs only when a consumer has some.
        "writes_secrets": any(unit["secret_file"] or any(unit["credentials"].values()) for unit in kept),
        # A drain runs on with the secrets it started with: one whose secrets
        # change ends after its batch in flight, and the next run reads them.
        "drains_by_secret": [{"path": path, "services": unit["services"]}
                             for unit in kept for path in unit["secret_paths"]],
        # what the consumers need laid out (wanted_files()) and the host lacks
        "files_to_lay_out": files_to_lay_out(
            wanted_files(units, settings, encrypted, queued)
            + metrics_left_behind(answers, settings, [unit["name"] for unit in kept]), answers, sources or {}),
        "removal": removal(units, answers, settings, encrypted),
    }


def digest(text):
    """The SHA-256 of a unit file's text, as consumer_preflight reports the host's."""
    return sha256(text)


def units_to_write(rendered, host_units):
    """The rendered unit files ({name: text}) whose content the host does not
    have (host_units: {name: SHA-256}, the consumer_preflight module's units)."""
    return {name: text for name, text in rendered.items() if host_units.get(name, "") != digest(text)}
