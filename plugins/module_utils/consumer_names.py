# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Names the role, the modules and the filters must agree on, defined once."""

from __future__ import annotations

import re

__metaclass__ = type

DEFAULT_PREFIX = "batchq-"
# The account consumers run as unless they name another; the role creates it.
DEFAULT_ACCOUNT = "batchq"
# secret_environment goes into SECRETS_DIR/<name>.env (mode 0600, root), never into a unit.
SECRETS_DIR = "/etc/batchq"
UNIT_DIR = "/etc/systemd/system"
# Runs the batches of a consumer with backlog_exit_code (roles/consumer/files/batchq-drain).
DRAIN_RUNNER = "/usr/local/lib/batchq/batchq-drain"
# ExecStopPost= of every consumer: its metrics and failure hooks (roles/consumer/files/batchq_after_run.py).
AFTER_RUN = "/usr/local/lib/batchq/batchq_after_run.py"
# Its state of each consumer's failure hooks, <dir>/<name>.json (STATE_DIR there).
HOOKS_STATE_DIR = "/var/lib/batchq-hooks"
# OnSuccess= of such a consumer: its drain goes on after a deploy (templates/consumer.continue.j2).
CONTINUE_UNIT = "batchq.continue@.service"
# Wakes one more instance of a consumer whose instances are a range, and puts
# one to sleep after its run (roles/consumer/files/batchq_scale.py); its unit
# batchq.scale@<prefix><name>.service is started by the consumer's path unit.
SCALE = "/usr/local/lib/batchq/batchq_scale.py"
SCALE_UNIT = "batchq.scale@.service"
# Where systemd makes each consumer's StateDirectory=: <dir>/<name>.
STATE_DIR = "/var/lib/batchq"
# The slice of every consumer unit of the host, whatever its prefix: the host's budget (consumer_budget).
SLICE_UNIT = "batchq.slice"
# Waits for a slot of that budget on systemd before 258, and reports each wait
# (roles/consumer/files/batchq_slots.py).
SLOTS = "/usr/local/lib/batchq/batchq_slots.py"

# A consumer's units: <prefix><name>.service/.timer, or with instances the
# templates <prefix><name>@.service/.timer and their instances <prefix><name>@N.*;
# with a range of instances, its path unit <prefix><name>.path too.
_UNIT_PATTERN = (r"^%s(?P<name>[a-z0-9][a-z0-9_-]*)(?P<at>@(?P<instance>[^.]*))?"
                 r"\.(?P<kind>service|timer|path)(?P<dropin>\.d)?$")


def unit_re(prefix=DEFAULT_PREFIX):
    """A regex for the unit files (and drop-in folders) of consumers with prefix."""
    return re.compile(_UNIT_PATTERN % re.escape(prefix))


def starter_unit(timer):
    """The transient timer that starts a consumer's timer after its start_delay.

    batchq-x.timer -> batchq-x.start.timer, batchq-x@2.timer -> batchq-x.2.start.timer:
    the dot keeps it outside unit_re(), so nothing takes it for a consumer, and
    no "@" keeps it from being an instance of the consumer's template.
    """
    stem = timer[:-len(".timer")] if timer.endswith(".timer") else timer
    return stem.replace("@", ".") + ".start.timer"
