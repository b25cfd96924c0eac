# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Validation and normalisation of consumer definitions.

Pure functions only: they take the user's data and return plain dicts or
raise ConsumerSpecError. The role calls them through the ``consumers`` filter
on the controller, so a bad consumer fails the play before any host changes.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_names import (
    DEFAULT_ACCOUNT,
    SECRETS_DIR,
)

__metaclass__ = type

TIME_KEYS = ("interval", "start_delay", "accuracy", "jitter", "timeout", "stop_timeout", "on_failure_every")
# Spans that systemd reads as "no limit" when 0: that is written "infinity".
LIMIT_KEYS = ("timeout", "stop_timeout")

# Built-in default of every key a consumer may carry; the user's
# consumer_defaults are laid over these, each item over both.
ITEM_DEFAULTS = {
    "name": None,
    "command": None,
    "interval": "1min",
    "start_delay": "5s",
    "accuracy": "1s",
    "jitter": "0",
    "timeout": "1h",
    # After SIGTERM (at timeout, or when stopped) a batch gets this long to end
    # before SIGKILL; systemd's own default of 90s is long for a queue.
    "stop_timeout": "30s",
    "user": DEFAULT_ACCOUNT,
    "group": DEFAULT_ACCOUNT,
    "allow_root": False,
    "environment": {},
    "environment_file": None,
    "secret_environment": {},
    # Secrets as systemd credentials: files in $CREDENTIALS_DIRECTORY for each
    # run (the batch's, or its failure hooks' for hook_credentials).
    "credentials": {},
    "hook_credentials": {},
    "working_directory": None,
    "writable_paths": [],
    "memory_max": None,
    "cpu_quota": None,
    "tasks_max": None,
    "nice": None,
    "io_weight": None,
    "instances": 1,
    "state": "present",
    "hardening": True,
    "service_options": {},
    "timer_options": {},
    # Exit status of a batch that took a full batch and leaves work waiting:
    # the next batch starts at once (see roles/consumer/files/batchq-drain).
    "backlog_exit_code": None,
    # Modules a draining Python consumer imports once per run: each batch is a
    # fork of the runner after those imports (batchq-drain --preload).
    "preload": [],
    # Commands run in units of their own after a failed batch (at most once per
    # on_failure_every while failures go on) and after the success that ends them.
    "on_failure": None,
    "on_recovery": None,
    "on_failure_every": "15min",
}
HOOK_KEYS = ("on_failure", "on_recovery")
# systemd counts time in microseconds in 64 bits, the top value meaning
# "infinity" (USEC_INFINITY): a span that reaches it is refused.
USEC_INFINITY = 2 ** 64 - 1
# Keys whose dicts are merged key by key, the consumer's own values winning,
# when consumer_defaults and a consumer both set them; other keys are replaced.
MERGED_KEYS = ("environment", "secret_environment", "credentials", "hook_credentials", "service_options",
               "timer_options")
STATES = ("present", "paused", "absent")
MAX_INSTANCES = 64
# instances as a range: {min, max, cooldown}. An instance woken above min
# stays awake at least this long (KEDA's cooldownPeriod is 300 s too): a
# stream that each batch empties does not wake and put it to sleep by turns.
RANGE_KEYS = ("min", "max", "cooldown")
DEFAULT_COOLDOWN = "5min"
# A backlog exit is a success that starts the next batch at once, so it must
# never be a status a crash gives: 1 (an uncaught exception, `set -e`), 2
# (usage errors), 126-127 (cannot run), 128+N (killed, in a shell), 200-243
# (systemd could not set the run up). 75 (EX_TEMPFAIL) is the usual choice.
BACKLOG_CODES = (3, 125)

# Used with fullmatch() only: re.match() with "$" also takes a trailing newline,
# which would end up in a unit name or split a unit file line.
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,47}")
ACCOUNT_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
OPTION_KEY_RE = re.compile(r"[A-Z][A-Za-z0-9]*")
MEMORY_RE = re.compile(r"infinity|[0-9]+(?:\.[0-9]+)?[KMGT]?|[0-9]+(?:\.[0-9]+)?%")
CPU_QUOTA_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?%")
PREFIX_RE = re.compile(r"[a-z0-9][a-z0-9_-]*-")
# A credential's name is a file name to systemd (credential_name_valid():
# no "/", not "." or "..", at most 255 bytes): the role takes a portable part
# short enough to fit, with the consumer's name, in the name of its file.
CREDENTIAL_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# What systemd loads for one unit at most (CREDENTIALS_TOTAL_SIZE_MAX).
CREDENTIALS_MAX_BYTES = 1024 * 1024
# On the host, beside the secret environment files: <consumer>.<NAME> and a
# suffix for the unit that reads it (the batch's, or its hooks') and the form
# it is in: an encrypted file has a name of its own, so that a unit written
# for the other form (before a systemd upgrade) never reads it.
CREDENTIAL_SUFFIX = {"credentials": ".cred", "hook_credentials": ".hookcred"}
ENCRYPTED_SUFFIX = "-encrypted"
# What a credential's value may be: a string, Ansible Vault's too (a class of
# its own, not a str, before ansible-core 2.19), never what str() would remake.
VAULT_TYPES = ("AnsibleVaultEncryptedUnicode", "EncryptedString")
# C0 controls and DEL: a newline (or CR, NUL) ends a unit file line, others
# change what systemd reads (a tab is white space to it) or garble logs.
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
CONTROL_PROBLEM = "must not contain a newline or any other control character"
LINE_BREAK_RE = re.compile(r"[\r\n]")
# What preload takes: dotted module names, and a command python3 runs.
MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
PYTHON_RE = re.compile(r"python[0-9.]*")
# The interpreter's options that take no value and mean the same to the
# runner that imports the preload as to the batch.
PYTHON_FLAGS_RE = re.compile(r"-[BEIOPsSu]+")
PRELOAD_COMMAND = ("with preload, must run Python: PYTHON [OPTIONS] SCRIPT ARGS, PYTHON [OPTIONS] -m MODULE ARGS,"
                   " or a script whose #! line names Python")

# systemd's time units (time-util.c), longest first so "ms" wins over "m".
_TIME_UNITS = {
    "usec": 1e-6, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6,
    "msec": 1e-3, "ms": 1e-3,
    "seconds": 1, "second": 1, "sec": 1, "s": 1,
    "minutes": 60, "minute": 60, "min": 60, "m": 60,
    "hours": 3600, "hour": 3600, "hr": 3600, "h": 3600,
    "days": 86400, "day": 86400, "d": 86400,
    "weeks": 604800, "week": 604800, "w": 604800,
    "months": 2629800, "month": 2629800, "M": 2629800,
    "years": 31557600, "year": 31557600, "y": 31557600,
}
_TIME_PART_RE = re.compile(
    r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*("
    + "|".join(sorted(map(re.escape, _TIME_UNITS), key=len, reverse=True))
    + r")?(?![A-Za-z\u00b5\u03bc])\s*"
)


class ConsumerSpecError(ValueError):
    """A consumer definition that cannot be deployed."""


def _fail(consumer, field, problem):
    raise ConsumerSpecError("consumer %r: field %r: %s" % (consumer, field, problem))


def parse_timespan(text):
    """Seconds in a systemd time span, float('inf') for "infinity".

    Mirrors systemd's parse_sec() closely enough to reject what systemd would;
    the role still asks `systemd-analyze timespan` on each host as the authority.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError("must be a time span string such as '30s' or '5min'")
    text = str(text)
    if CONTROL_RE.search(text):
        raise ValueError("%s, got %r" % (CONTROL_PROBLEM, text))
    text = text.strip()
    if text == "infinity":
        return float("inf")
    if not text:
        raise ValueError("is empty")
    if text.startswith("-"):
        raise ValueError("%r is negative: a time span is 0 or longer" % text)
    total, pos = 0.0, 0
    while pos < len(text):
        match = _TIME_PART_RE.match(text, pos)
        if not match or match.end() == pos:
            raise ValueError("%r is not a systemd time span (e.g. '30s', '5min', '1h 30min')" % text)
        total += float(match.group(1)) * _TIME_UNITS.get(match.group(2) or "s", 1)
        pos = match.end()
    if total * 1e6 >= USEC_INFINITY:
        # systemd's own limit per part is a little stricter: the host's
        # systemd-analyze has the last word
        raise ValueError("%r is longer than systemd can count (about 584542 years)" % text)
    return total


def _as_bool(consumer, field, value):
    if isinstance(value, bool):
        return value
    lowered = str(value).lower()
    if lowered in ("yes", "true", "on", "1"):
        return True
    if lowered in ("no", "false", "off", "0"):
        return False
    _fail(consumer, field, "must be a boolean, got %r" % (value,))


def _as_int(consumer, field, value, low, high):
    if isinstance(value, bool) or not re.fullmatch(r"-?[0-9]+", str(value).strip()):
        _fail(consumer, field, "must be a whole number, got %r" % (value,))
    number = int(str(value).strip())
    if not low <= number <= high:
        _fail(consumer, field, "must be between %d and %d, got %d" % (low, high, number))
    return number


def _single_line(consumer, field, value):
    text = str(value)
    control = CONTROL_RE.search(text)
    if control:
        # the character only: the value may be a secret
        _fail(consumer, field, "%s, found %r" % (CONTROL_PROBLEM, control.group()))
    return text


def _absolute_path(consumer, field, value):
    text = _single_line(consumer, field, value)
    if not text.startswith("/"):
        _fail(consumer, field, "must be an absolute path, got %r" % text)
    if {".", ".."} & set(text.split("/")):
        # systemd refuses paths that are not normalized and ignores the setting
        _fail(consumer, field, "must not contain '.' or '..' components, got %r" % text)
    return text


def _bare_path(consumer, field, value):
    """A path for a setting that takes the rest of the line unquoted."""
    text = _absolute_path(consumer, field, value)
    if text != text.rstrip():
        # systemd strips it: the setting would name another path
        _fail(consumer, field, "must not end in white space, got %r" % text)
    return text


def _working_directory(consumer, value):
    text = _bare_path(consumer, "working_directory", value)
    if text.endswith("\\"):
        # WorkingDirectory= has no escape for it: the line would continue
        _fail(consumer, "working_directory", "cannot end in a backslash, got %r" % text)
    return text


def split_command(consumer, command, field="command"):
    """The argv of a consumer's command: a list as given, a string split like a shell."""
    if isinstance(command, (list, tuple)):
        argv = [str(word) for word in command]
    elif isinstance(command, str):
        # A shell runs each line as a command of its own; the split would take
        # the lines as one command, the later lines its arguments. YAML's ">"
        # folds lines into one and ends it with a newline, which is stripped.
        if LINE_BREAK_RE.search(command.strip()):
            _fail(consumer, field, "is a string of more than one line: give one command line "
                  "(YAML's '>' folds lines into one), or a list of arguments")
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            _fail(consumer, field, "cannot be split into words: %s" % exc)
    else:
        _fail(consumer, field, "must be a string or a list of arguments")
    if not argv or not argv[0]:
        _fail(consumer, field, "is empty")
    for word in argv:
        _single_line(consumer, field, word)
    if not argv[0].startswith("/"):
        _fail(consumer, field, "must start with an absolute path, got %r" % argv[0])
    return argv


def preload_command(consumer, argv):
    """How the runner runs a preloaded consumer's command: (the interpreter's
    words, or None when argv[0] is a script whose #! line the host must tell,
    and what `python3` runs: [SCRIPT, ARGS...] or ["-m", MODULE, ARGS...])."""
    if not PYTHON_RE.fullmatch(posixpath.basename(argv[0])):
        return None, argv
    words = argv[1:]
    flags = []
    while words and PYTHON_FLAGS_RE.fullmatch(words[0]):
        flags.append(words.pop(0))
    if words[:1] == ["-m"] and len(words) > 1 and MODULE_RE.fullmatch(words[1]):
        return [argv[0]] + flags, words
    if words and not words[0].startswith("-"):
        return [argv[0]] + flags, words
    _fail(consumer, "command", PRELOAD_COMMAND + ", got %r" % " ".join(argv))
    return None, None  # not reached: _fail raises


def shebang_python(first_line):
    """The words of a #! line that runs Python (the interpreter, or env and
    it, and its options), or None for any other first line."""
    if not isinstance(first_line, str) or not first_line.startswith("#!"):
        return None
    words = first_line[2:].split()
    env = []
    if words and posixpath.basename(words[0]) == "env":
        env, words = words[:1], words[1:]
        if words[:1] == ["-S"]:
            words = words[1:]  # env -S splits what follows into words, as here
    if not words or not PYTHON_RE.fullmatch(posixpath.basename(words[0])):
        return None
    if not all(PYTHON_FLAGS_RE.fullmatch(word) for word in words[1:]):
        return None
    return env + words


def preload_pythons(consumers, first_lines, host="this host"):
    """The interpreter of each preloaded consumer on a host, quoted for
    ExecStart=, from its command or its script's #! line (first_lines, as
    consumer_preflight read them): {"pythons": {name: words}, "problems": [...]}."""
    pythons, problems = {}, []
    for consumer in consumers:
        if not consumer.get("preload") or consumer.get("state") == "absent":
            continue
        if consumer["preload_python"]:
            pythons[consumer["name"]] = consumer["preload_python"]
            continue
        script = consumer["preload_script"]
        words = shebang_python(first_lines.get(script))
        if words is None:
            problems.append("consumer '%s': field 'command': %s; %s on %s starts with %s;" % (
                consumer["name"], PRELOAD_COMMAND, script, host, json.dumps(first_lines.get(script))))
        else:
            pythons[consumer["name"]] = " ".join(systemd_quote(word) for word in words)
    return {"pythons": pythons, "problems": problems}


def systemd_word(text):
    """One double-quoted word of a setting that splits its value into words
    and expands specifiers (Environment=, ReadWritePaths=, ...).

    Double quotes stop word splitting; inside them a backslash and a quote are
    backslash-escaped and '%' is doubled against specifier expansion
    (systemd.syntax(7)).
    """
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"%s"' % escaped.replace("%", "%%")


def systemd_quote(word):
    """One ExecStart= word that systemd hands to the process unchanged.

    Like systemd_word(), and '$' is doubled against environment variable
    expansion, which only command lines have (systemd.service(5)).
    """
    return systemd_word(word).replace("$", "$$")


def systemd_environment(key, value):
    """One Environment= assignment whose value reaches the process unchanged.

    Environment= expands specifiers but not variables, so only '%' is doubled.
    """
    return systemd_word("%s=%s" % (key, value))


def systemd_path(path):
    """A WorkingDirectory= path: the rest of the line, unquoted, with
    specifiers expanded (systemd.exec(5)), so only '%' is doubled."""
    return path.replace("%", "%%")


def systemd_glob_path(path):
    """An EnvironmentFile= path, which systemd also expands as a glob pattern
    when the service starts: a backslash before each of '\\ * ? [' makes
    glob(3) take it literally, then '%' is doubled against specifiers."""
    return systemd_path(re.sub(r"([\\*?\[])", r"\\\1", path))


# ExecStartPre= of a consumer with environment files: systemd would fail a
# run whose EnvironmentFile= is missing before any command (result
# "resources"), ExecStopPost= included, so no metrics and no hook would tell
# it. The files are optional to systemd ("-"), and this fails the run instead,
# saying which file is missing, as root ("+": the sandbox may hide it).
ENVIRONMENT_CHECK = ('for file; do [ -r "$file" ] && continue; '
                     'echo "batchq: environment file $file is missing; this run fails" >&2; exit 1; done')


def environment_check(paths):
    """The ExecStartPre= command line that fails a run when one of paths is missing, or None."""
    if not paths:
        return None
    return " ".join(systemd_quote(word) for word in ["/bin/sh", "-c", ENVIRONMENT_CHECK, "environment-check"] + list(paths))


def _check_timespans(name, item):
    """Fail unless every time span is one systemd takes and the role can use."""
    spans = {}
    for field in TIME_KEYS:
        value = item[field]
        try:
            seconds = parse_timespan(value)
        except ValueError as exc:
            _fail(name, field, str(exc))
        if seconds == float("inf") and (field not in LIMIT_KEYS or str(value).strip() != "infinity"):
            _fail(name, field, "must be finite" if field not in LIMIT_KEYS else "write 'infinity' explicitly")
        # systemd drops what is below a microsecond: "0.3us" is 0, which is
        # no timeout at all for a timeout, and a timer that fires at once.
        if 0 < seconds < 1e-6:
            _fail(name, field, "%r is less than a microsecond, which systemd reads as 0" % str(value).strip())
        spans[field] = seconds
    if spans["interval"] <= 0:
        _fail(name, "interval", "must be longer than 0")
    for field in LIMIT_KEYS:
        if spans[field] <= 0:
            _fail(name, field, "must be longer than 0 (systemd reads 0 as no timeout; write 'infinity' for that)")


def _variables(name, field, variables):
    """Validated (NAME, value) pairs of an environment or secret_environment dict."""
    if not isinstance(variables, dict):
        _fail(name, field, "must be a dict of NAME: value")
    pairs = []
    for key in sorted(variables):
        if not ENV_KEY_RE.fullmatch(str(key)):
            _fail(name, field, "%r is not a valid variable name" % (key,))
        value = variables[key]
        if isinstance(value, (dict, list)) or value is None:
            _fail(name, field, "value of %s must be a string or number" % key)
        if isinstance(value, bool):
            value = "true" if value else "false"
        pairs.append((key, _single_line(name, field, value)))
    return pairs


def _credentials(name, field, credentials):
    """Validated (NAME, value) pairs of credentials or hook_credentials; a value
    is any string (several lines, a key file), never a number or a structure."""
    if not isinstance(credentials, dict):
        _fail(name, field, "must be a dict of NAME: secret value")
    pairs = []
    for key in sorted(credentials, key=str):
        if not isinstance(key, str) or not CREDENTIAL_NAME_RE.fullmatch(key):
            _fail(name, field, "%r is not a credential name: 1-128 letters, digits, '_', '.' and '-',"
                               " starting with a letter, digit or '_'" % (key,))
        value = credentials[key]
        if not isinstance(value, str) and type(value).__name__ not in VAULT_TYPES:
            # a number would lose its form (0123, 1e3), bytes and dates would be remade;
            # named by its base type, not ansible-core's tagged subclass of it
            kind = next((base.__name__ for base in (bool, int, float, bytes, dict, list) if isinstance(value, base)),
                        type(value).__name__)
            _fail(name, field, "value of %s must be a string, got %s%s" % (
                key, kind, " (quote it, or template it with | string)" if kind in ("int", "float") else ""))
        pairs.append((key, str(value)))
    if sum(len(value.encode("utf-8")) for _key, value in pairs) > CREDENTIALS_MAX_BYTES:
        _fail(name, field, "the values are larger than 1 MiB together, more than systemd loads for one unit")
    return pairs


def credential_path(consumer, field, key, encrypted=False):
    """Where a credential of a consumer waits on the host for systemd to load it."""
    return "%s/%s.%s%s%s" % (SECRETS_DIR, consumer, key, CREDENTIAL_SUFFIX[field],
                             ENCRYPTED_SUFFIX if encrypted else "")


def environment_file_line(key, value):
    """KEY="value" as systemd's EnvironmentFile= parser reads it back verbatim.

    Inside double quotes that parser takes a backslash followed by a backslash,
    a double quote, a backtick or a dollar sign as that character, and keeps
    every other character as it is.
    """
    escaped = "".join("\\" + char if char in '\\"`$' else char for char in value)
    return '%s="%s"\n' % (key, escaped)


def layered(raw, defaults):
    """A consumer's settings: the built-in defaults, consumer_defaults over them,
    the consumer's own over both. MERGED_KEYS merge when both layers hold dicts
    (anything else is left for validation to refuse)."""
    item = dict(ITEM_DEFAULTS)
    for layer in (defaults or {}, raw):
        for key, value in layer.items():
            if key in MERGED_KEYS and isinstance(value, dict) and isinstance(item.get(key), dict):
                merged = dict(item[key])
                merged.update(value)
                value = merged
            item[key] = value
    return item


def secret_files(consumers, defaults=None):
    """{path: content} of the secret environment files of consumers that keep units.

    Kept apart from normalize_consumers() so that the values only ever pass
    through a task that is not logged.
    """
    files = {}
    for raw in consumers:
        item = layered(raw, defaults)
        pairs = _variables(item["name"], "secret_environment", item["secret_environment"])
        if pairs and item["state"] != "absent":
            files["%s/%s.env" % (SECRETS_DIR, item["name"])] = "".join(environment_file_line(k, v) for k, v in pairs)
    return files


def credential_files(consumers, defaults=None, encrypted=False):
    """[{path, name, value}] of the credentials of consumers that keep units, for
    the task that writes them (not logged), as secret_files() is; the paths of
    encrypted files with encrypted."""
    files = []
    for raw in consumers:
        item = layered(raw, defaults)
        if item["state"] == "absent":
            continue
        for field in CREDENTIAL_SUFFIX:
            for key, value in _credentials(item["name"], field, item[field]):
                files.append({"path": credential_path(item["name"], field, key, encrypted), "name": key,
                              "value": value})
    return files


# The settings that choose a unit's account: the consumer's user and group
# keys set them, where the role checks them.
ACCOUNT_OPTIONS = ("User", "Group", "DynamicUser")


def _raw_options(name, field, options):
    if not isinstance(options, dict):
        _fail(name, field, "must be a dict of systemd Setting: value")
    result = []
    for key in sorted(options):
        if not OPTION_KEY_RE.fullmatch(str(key)):
            _fail(name, field, "%r is not a systemd setting name" % (key,))
        if field == "service_options" and key == "Slice":
            # the host's budget holds every consumer (consumer_budget): a unit of another slice would escape it
            _fail(name, field, "Slice is the role's: every consumer runs in batchq.slice, capped by consumer_budget")
        if field == "service_options" and key in ACCOUNT_OPTIONS:
            # the account is checked (root needs allow_root) only as the consumer's own keys
            _fail(name, field, "%s is the role's: set the consumer's user and group keys instead" % key)
        values = options[key] if isinstance(options[key], list) else [options[key]]
        for value in values:
            if isinstance(value, bool):
                value = "yes" if value else "no"
            if isinstance(value, (dict, list)) or value is None:
                _fail(name, field, "value of %s must be a string or number" % key)
            text = _single_line(name, field, value)
            if field == "service_options" and key.startswith("Exec") and not text.strip():
                # an empty value empties the list: the role's own commands (the slot of the host's budget,
                # the metrics and hooks) would go
                _fail(name, field, "an empty %s would remove the role's own commands" % key)
            if text.endswith("\\"):
                _fail(name, field, "value of %s ends in a backslash, which systemd reads as a line continuation" % key)
            result.append((key, text))
    return result


def _resources(name, item):
    limits = {}
    if item["memory_max"] is not None:
        if not MEMORY_RE.fullmatch(str(item["memory_max"])):
            _fail(name, "memory_max", "must be bytes with an optional K, M, G or T suffix, a percentage or 'infinity', got %r" % (item["memory_max"],))
        limits["MemoryMax"] = str(item["memory_max"])
    if item["cpu_quota"] is not None:
        if not CPU_QUOTA_RE.fullmatch(str(item["cpu_quota"])):
            _fail(name, "cpu_quota", "must be a percentage such as '50%%', got %r" % (item["cpu_quota"],))
        limits["CPUQuota"] = str(item["cpu_quota"])
    if item["tasks_max"] is not None:
        tasks = str(item["tasks_max"])
        limits["TasksMax"] = tasks if tasks == "infinity" else str(_as_int(name, "tasks_max", tasks, 1, 4194304))
    if item["nice"] is not None:
        limits["Nice"] = str(_as_int(name, "nice", item["nice"], -20, 19))
    if item["io_weight"] is not None:
        limits["IOWeight"] = str(_as_int(name, "io_weight", item["io_weight"], 1, 10000))
    return limits


def _instances(name, value, backlog):
    """(min, max, cooldown) of instances: a whole number is a fixed count
    (min = max, no cooldown), a dict a range {min, max, cooldown}."""
    if not isinstance(value, dict):
        count = _as_int(name, "instances", value, 1, MAX_INSTANCES)
        return count, count, None
    unknown = sorted(str(key) for key in set(value) - set(RANGE_KEYS))
    if unknown:
        _fail(name, "instances", "%r is not a key of a range of instances (min, max, cooldown)" % unknown[0])
    for key in ("min", "max"):
        if key not in value:
            _fail(name, "instances", "a range needs min and max, e.g. {min: 1, max: 4}; a whole number is a fixed count")
    low = _as_int(name, "instances.min", value["min"], 1, MAX_INSTANCES)
    high = _as_int(name, "instances.max", value["max"], 1, MAX_INSTANCES)
    if low > high:
        _fail(name, "instances", "min %d is more than max %d" % (low, high))
    cooldown = str(value.get("cooldown", DEFAULT_COOLDOWN)).strip()
    try:
        if parse_timespan(cooldown) == float("inf"):
            raise ValueError("must be a finite time span, got 'infinity'")
    except ValueError as exc:
        _fail(name, "instances.cooldown", str(exc))
    if low < high and backlog is None:
        _fail(name, "instances", "a range needs backlog_exit_code: an instance asks for another only while its"
                                 " batches say more work waits")
    return low, high, cooldown if low < high else None


def _preload(name, modules, backlog):
    """The module names of preload, checked: a drain's alone."""
    if modules is None or modules == []:
        return []
    if not isinstance(modules, list) or not modules:
        _fail(name, "preload", "must be a list of Python module names, got %r" % (modules,))
    for module in modules:
        if not isinstance(module, str) or not MODULE_RE.fullmatch(module):
            _fail(name, "preload", "%r is not a Python module name (such as psycopg or myapp.jobs)" % (module,))
    if backlog is None:
        _fail(name, "preload", "needs backlog_exit_code: the runner of a drain, which lives for the whole run,"
                               " is what imports the modules and forks each batch")
    return list(dict.fromkeys(modules))


def normalize_consumer(raw, defaults, prefix, position=1):
    """One consumer, validated, with everything the unit templates need;
    position: its place in consumer_list, from 1, for an error without a name."""
    if not isinstance(raw, dict):
        raise ConsumerSpecError("consumer_list item %d: every item must be a dict, got %r" % (position, raw))
    name = raw.get("name")
    if name is None:
        raise ConsumerSpecError("consumer_list item %d: field 'name': is required" % position)
    if not isinstance(name, str):
        # YAML reads 123 as a number, 0123 as another, yes as true: a name is written as a string
        raise ConsumerSpecError("consumer_list item %d: field 'name': must be a string (quote it), got %r"
                                % (position, name))
    if not NAME_RE.fullmatch(name):
        raise ConsumerSpecError(
            "consumer %r: field 'name': must be 1-48 lowercase letters, digits, '-' or '_',"
            " starting with a letter or digit" % (name,))
    item = layered(raw, defaults)
    unknown = sorted(set(item) - set(ITEM_DEFAULTS))
    if unknown:
        _fail(name, unknown[0], "is not a consumer setting (known: %s)" % ", ".join(sorted(ITEM_DEFAULTS)))
    if item["state"] not in STATES:
        _fail(name, "state", "must be one of %s, got %r" % (", ".join(STATES), item["state"]))
    if item["command"] is None and item["state"] != "absent":
        _fail(name, "command", "is required")

    hardening = _as_bool(name, "hardening", item["hardening"])
    for field in ("user", "group"):
        if not ACCOUNT_RE.fullmatch(str(item[field])):
            _fail(name, field, "%r is not a valid account name" % (item[field],))
    if hardening and "root" in (item["user"], item["group"]) and not _as_bool(name, "allow_root", item["allow_root"]):
        _fail(name, "user", "root with hardening on needs allow_root: true")
    if not isinstance(item["writable_paths"], list):
        _fail(name, "writable_paths", "must be a list of absolute paths")

    _check_timespans(name, item)
    backlog = None if item["backlog_exit_code"] is None else _as_int(
        name, "backlog_exit_code", item["backlog_exit_code"], *BACKLOG_CODES)
    least, instances, cooldown = _instances(name, item["instances"], backlog)
    usec = {field: 0 if seconds == float("inf") else int(round(seconds * 1e6))
            for field, seconds in ((f, parse_timespan(item[f])) for f in LIMIT_KEYS)}
    argv = None if item["command"] is None else split_command(name, item["command"])
    preload = _preload(name, item["preload"], backlog)
    python, target = preload_command(name, argv) if preload and argv else (None, None)
    if python and target[0] == "-m" and target[1] in preload:
        _fail(name, "preload", "%s is the module the command runs, afresh in each batch: preload what it imports"
              % target[1])
    hooks = {field: None if item[field] is None else split_command(name, item[field], field) for field in HOOK_KEYS}
    # each validated once: {field: [(NAME, value)]}
    credentials = {field: _credentials(name, field, item[field]) for field in CREDENTIAL_SUFFIX}
    if credentials["hook_credentials"] and not any(hooks.values()):
        _fail(name, "hook_credentials", "needs on_failure or on_recovery: only a hook's own unit loads them")
    # Also for a drain, whose ExecStart= names the runner: verify never sees the command.
    required_paths = [{"field": "command", "path": argv[0]}] if argv else []
    if python and target[0] != "-m" and target[0].startswith("/"):
        required_paths.append({"field": "command", "path": target[0]})
    required_paths += [{"field": field, "path": hooks[field][0]} for field in HOOK_KEYS if hooks[field]]
    required_paths += [
        {"field": field, "path": item[field]} for field in ("environment_file", "working_directory") if item[field]
    ] + [{"field": "writable_paths", "path": path} for path in item["writable_paths"]]
    unit = prefix + name
    service = "%s%s.service" % (unit, "@" if instances > 1 else "")
    timer = "%s%s.timer" % (unit, "@" if instances > 1 else "")
    timers = [timer] if instances == 1 else ["%s@%d.timer" % (unit, i) for i in range(1, instances + 1)]
    return {
        "name": name,
        "state": item["state"],
        # the most instances, and those always scheduled: equal, unless instances is a range
        "instances": instances,
        "min_instances": least,
        # a range: instances above min wake while a backlog lasts (batchq_scale.py), and sleep when it is gone
        "scale": None if cooldown is None else {
            "min": least, "max": instances, "cooldown_usec": int(round(parse_timespan(cooldown) * 1e6)),
            "path_unit": unit + ".path"},
        "service_unit": service,
        "timer_unit": timer,
        "timers": timers,
        # the timers a deploy and a resume start; the others of a range wake with the backlog
        "scheduled_timers": timers[:least],
        # the services those timers start, one per instance
        "services": [service] if instances == 1 else ["%s@%d.service" % (unit, i) for i in range(1, instances + 1)],
        "exec_start": None if argv is None else " ".join(systemd_quote(word) for word in argv),
        "environment": [systemd_environment(*pair) for pair in _variables(name, "environment", item["environment"])],
        "environment_file": item["environment_file"] and systemd_glob_path(
            _bare_path(name, "environment_file", item["environment_file"])),
        "secret_names": [key for key, value in _variables(name, "secret_environment", item["secret_environment"])],
        "secret_file": "%s/%s.env" % (SECRETS_DIR, name) if item["secret_environment"] else None,
        # what a batch reads of its secrets (a drain's runner loads them once per run)
        "secret_paths": ((["%s/%s.env" % (SECRETS_DIR, name)] if item["secret_environment"] else [])
                         + [credential_path(name, "credentials", key, encrypted)
                            for key, _value in credentials["credentials"] for encrypted in (False, True)]),
        # {field: [{name, path, encrypted_path}]}: what LoadCredential(Encrypted)= loads, for the batch and for its hooks
        "credentials": {field: [{"name": key, "path": credential_path(name, field, key),
                                 "encrypted_path": credential_path(name, field, key, True)}
                                for key, _value in pairs]
                        for field, pairs in credentials.items()},
        "environment_check": environment_check(
            ([item["environment_file"]] if item["environment_file"] else [])
            + (["%s/%s.env" % (SECRETS_DIR, name)] if item["secret_environment"] else [])),
        "working_directory": item["working_directory"] and systemd_path(
            _working_directory(name, item["working_directory"])),
        "writable_paths": [systemd_word(_absolute_path(name, "writable_paths", path)) for path in item["writable_paths"]],
        "required_paths": required_paths,
        "user": str(item["user"]),
        "group": str(item["group"]),
        "hardening": hardening,
        "spans": {field: str(item[field]).strip() for field in TIME_KEYS},
        "backlog_exit_code": backlog,
        "preload": preload,
        # The interpreter that runs the runner of a preloaded consumer, quoted
        # for ExecStart=; None: the #! line of preload_script, read on the host.
        "preload_python": python and " ".join(systemd_quote(word) for word in python),
        "preload_script": None if python or not preload or not argv else argv[0],
        # what the runner's forked batches run: SCRIPT ARGS or -m MODULE ARGS
        "preload_target": target and " ".join(systemd_quote(word) for word in target),
        # batchq-drain times each batch of a drain out itself; 0: no limit
        "timeout_usec": usec["timeout"],
        "stop_timeout_usec": usec["stop_timeout"],
        # for the metrics (batchq_consumer_interval_seconds)
        "interval_usec": int(round(parse_timespan(item["interval"]) * 1e6)),
        # the failure hooks, as the runtime spec gives them to batchq_after_run.py
        "hooks": None if not any(hooks.values()) else {
            "every_usec": int(round(parse_timespan(item["on_failure_every"]) * 1e6)),
            "on_failure": hooks["on_failure"], "on_recovery": hooks["on_recovery"]},
        "resources": _resources(name, item),
        "service_options": _raw_options(name, "service_options", item["service_options"]),
        "timer_options": _raw_options(name, "timer_options", item["timer_options"]),
    }


def normalize_consumers(consumers, defaults=None, prefix="batchq-"):
    """Every consumer of a host, validated as a whole (names are unique)."""
    if not isinstance(consumers, list):
        raise ConsumerSpecError("consumer_list must be a list of consumers")
    if defaults is None:
        defaults = {}
    if not isinstance(defaults, dict):
        raise ConsumerSpecError("consumer_defaults must be a dict")
    if "name" in defaults:
        raise ConsumerSpecError("consumer_defaults: field 'name' cannot have a default")
    unknown = sorted(set(defaults) - set(ITEM_DEFAULTS), key=str)
    if unknown:
        raise ConsumerSpecError("consumer_defaults: field %r: is not a consumer setting (known: %s)"
                                % (unknown[0], ", ".join(sorted(ITEM_DEFAULTS))))
    if not PREFIX_RE.fullmatch(str(prefix)):
        raise ConsumerSpecError("consumer_unit_prefix %r must be lowercase letters, digits, '_' or '-' and end in '-'" % (prefix,))
    normalized, seen = [], set()
    for position, raw in enumerate(consumers, 1):
        consumer = normalize_consumer(raw, defaults, prefix, position)
        if consumer["name"] in seen:
            _fail(consumer["name"], "name", "is used by more than one consumer")
        seen.add(consumer["name"])
        normalized.append(consumer)
    return normalized
