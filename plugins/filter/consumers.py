# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that turn the user's consumer definitions into unit settings."""

from __future__ import annotations

import os

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_metrics import metrics_files
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_layout import sha256
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_plan import (
    HELPERS,
    plan,
    questions,
    units_to_write,
    with_texts,
)
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_names import (
    AFTER_RUN,
    CONTINUE_UNIT,
    DEFAULT_ACCOUNT,
    DEFAULT_PREFIX,
    DRAIN_RUNNER,
    HOOKS_STATE_DIR,
    SECRETS_DIR,
    SCALE,
    SCALE_UNIT,
    SLICE_UNIT,
    SLOTS,
    UNIT_DIR,
)
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_status import problems, table
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_spec import (
    ConsumerSpecError,
    credential_files,
    normalize_consumers,
    secret_files,
)

__metaclass__ = type

# Each filter's documentation is the .yml file of its name beside this one
# (consumers.yml, consumer_plan.yml, ...), as ansible-core documents the
# filters of one Python file: a DOCUMENTATION here would hide them all.


# What the role's vars/main.yml takes from consumer_names, so that each is
# written down once for the Python and the role alike.
NAMES = {"account": DEFAULT_ACCOUNT, "secrets_dir": SECRETS_DIR, "unit_dir": UNIT_DIR,
         "drain_runner": DRAIN_RUNNER, "continue_unit": CONTINUE_UNIT, "after_run": AFTER_RUN,
         "hooks_state_dir": HOOKS_STATE_DIR, "slice_unit": SLICE_UNIT, "slots": SLOTS,
         "scale": SCALE, "scale_unit": SCALE_UNIT}


def consumers(value, defaults=None, prefix=DEFAULT_PREFIX):
    try:
        return normalize_consumers(value, defaults or {}, prefix)
    except ConsumerSpecError as exc:
        raise AnsibleFilterError(str(exc)) from exc


# The settings a plan needs beyond account, prefix, metrics, metrics_dir and
# helper_dir, as the role sets them when a caller gives none.
PLAN_DEFAULTS = {"exclusive": False, "unit_dir": UNIT_DIR, "secrets_dir": SECRETS_DIR, "hooks_state_dir": HOOKS_STATE_DIR}

# What consumer_preflight answers when asked the questions of consumer_questions
# with the plan's settings, and the plan needs.
PLAN_ANSWERS = ("found", "unit_states", "stat", "stale_units")


def _plan_settings(settings):
    settings = dict(PLAN_DEFAULTS, **settings)
    # A switch given on the command line (-e consumer_metrics=false) is a string.
    return dict(settings, **{name: boolean(settings[name], strict=False) for name in ("metrics", "exclusive")})


def consumer_questions(normalized, account=DEFAULT_ACCOUNT, settings=None):
    return questions(normalized, account, None if settings is None else _plan_settings(settings))


def consumer_plan(normalized, answers, settings, host="this host", files_dir=None):
    missing = [key for key in PLAN_ANSWERS if key not in answers]
    if missing:
        raise AnsibleFilterError("consumer_plan: the answers have no %s: ask consumer_preflight the questions of"
                                 " consumer_questions with the plan's settings, and the folders to find, as the role"
                                 " does" % ", ".join(missing))
    sources = {}
    for name in HELPERS if files_dir else ():
        with open(os.path.join(files_dir, name), "rb") as handle:
            sources[name] = sha256(handle.read())
    return plan(normalized, answers, _plan_settings(settings), host, sources)


def consumer_file_texts(files, folder):
    """Each file the plan copies from the role's files folder, with its text."""
    def read(name):
        with open(os.path.join(folder, name), encoding="utf-8", newline="") as handle:  # byte for byte, as the file lookup read it
            return handle.read()
    return with_texts(files, read)


def consumer_units_to_write(rendered, host_units):
    return units_to_write(rendered, host_units or {})


def consumer_secret_files(value, defaults=None):
    try:
        return secret_files(value, defaults or {})
    except ConsumerSpecError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def consumer_credential_files(value, defaults=None, encrypted=False):
    try:
        return credential_files(value, defaults or {}, bool(encrypted))
    except ConsumerSpecError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def consumer_names(value):
    try:
        return NAMES[value]
    except (KeyError, TypeError) as exc:
        raise AnsibleFilterError("consumer_names: %r is not one of %s" % (value, ", ".join(sorted(NAMES)))) from exc


def consumer_metrics_files(normalized, folder, prefix=DEFAULT_PREFIX, enabled=True, paused=None, only_paused=False):
    return metrics_files(normalized, folder, prefix, enabled, paused, only_paused)


def consumer_status_table(reports, now):
    return table(reports, now)


def consumer_status_problems(reports, now, fail_on_failed=False, max_age=None):
    # Extra vars arrive as strings: -e consumer_status_max_age=3600
    return problems(reports, float(now), bool(fail_on_failed), None if max_age in (None, "") else float(max_age))


class FilterModule:
    def filters(self):
        return {
            "consumers": consumers,
            "consumer_credential_files": consumer_credential_files,
            "consumer_file_texts": consumer_file_texts,
            "consumer_metrics_files": consumer_metrics_files,
            "consumer_names": consumer_names,
            "consumer_plan": consumer_plan,
            "consumer_questions": consumer_questions,
            "consumer_secret_files": consumer_secret_files,
            "consumer_status_table": consumer_status_table,
            "consumer_status_problems": consumer_status_problems,
            "consumer_units_to_write": consumer_units_to_write,
        }
