"""Validation and quoting of consumer definitions (pure functions, no host)."""

import pathlib
import re

import pytest

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_names import DEFAULT_ACCOUNT, SECRETS_DIR
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_spec import (
    ConsumerSpecError,
    credential_files,
    normalize_consumers,
    parse_timespan,
    preload_pythons,
    secret_files,
    shebang_python,
    systemd_environment,
    systemd_quote,
)

GOOD = {"name": "thumbs", "command": "/usr/bin/process_queue --limit 100"}


def one(**fields):
    return normalize_consumers([dict(GOOD, **fields)])[0]


@pytest.mark.parametrize("text, seconds", [
    ("1min", 60), ("90s", 90), ("1h 30min", 5400), ("1h30min", 5400), ("100ms", 0.1),
    ("2", 2), ("1.5h", 5400), (" 5 min ", 300), ("1w", 604800), ("1M", 2629800), ("1m", 60),
    (30, 30), ("0", 0),
])
def test_timespans_systemd_accepts(text, seconds):
    assert parse_timespan(text) == pytest.approx(seconds)


def test_infinity_is_infinite():
    assert parse_timespan("infinity") == float("inf")


@pytest.mark.parametrize("text", ["1 fortnight", "-5s", "", "5 s s", "1mx", "s", True, None, "1h,2m",
                                  "99999999999999y", "18446744073709551615us", "584542y 1y"])
def test_timespans_systemd_rejects(text):
    with pytest.raises(ValueError):
        parse_timespan(text)


def test_a_span_just_below_what_systemd_counts_is_accepted():
    # systemd-analyze timespan takes 584541y (252 and 257) and refuses 584542y
    assert parse_timespan("584541y") == pytest.approx(584541 * 31557600)


def test_defaults_of_a_minimal_consumer():
    consumer = one()
    assert consumer["spans"] == {
        "interval": "1min", "start_delay": "5s", "accuracy": "1s", "jitter": "0", "timeout": "1h",
        "stop_timeout": "30s", "on_failure_every": "15min"}
    assert (consumer["service_unit"], consumer["timer_unit"]) == ("batchq-thumbs.service", "batchq-thumbs.timer")
    assert consumer["timers"] == ["batchq-thumbs.timer"]
    assert consumer["services"] == ["batchq-thumbs.service"]
    assert (consumer["user"], consumer["group"], consumer["hardening"]) == ("batchq", "batchq", True)
    assert consumer["exec_start"] == '"/usr/bin/process_queue" "--limit" "100"'


def test_instances_make_template_units_and_one_timer_each():
    consumer = one(instances=3)
    assert [consumer["service_unit"], consumer["timer_unit"]] == ["batchq-thumbs@.service", "batchq-thumbs@.timer"]
    assert consumer["timers"] == ["batchq-thumbs@1.timer", "batchq-thumbs@2.timer", "batchq-thumbs@3.timer"]
    assert consumer["services"] == ["batchq-thumbs@1.service", "batchq-thumbs@2.service", "batchq-thumbs@3.service"]


def test_a_range_of_instances_schedules_min_and_wakes_the_rest_with_the_backlog():
    consumer = one(instances={"min": 2, "max": 4}, backlog_exit_code=75)
    assert consumer["timers"] == ["batchq-thumbs@%d.timer" % n for n in (1, 2, 3, 4)]
    assert consumer["scheduled_timers"] == ["batchq-thumbs@1.timer", "batchq-thumbs@2.timer"]
    assert consumer["scale"] == {"min": 2, "max": 4, "cooldown_usec": 300_000_000, "path_unit": "batchq-thumbs.path"}
    assert one(instances={"min": 1, "max": 3, "cooldown": "45s"}, backlog_exit_code=75)["scale"]["cooldown_usec"] == 45e6
    # min = max is a fixed count, as a number is
    fixed = one(instances={"min": 3, "max": 3})
    assert fixed["scale"] is None and fixed["scheduled_timers"] == fixed["timers"] == one(instances=3)["timers"]


def test_defaults_lie_under_items_and_prefix_names_units():
    consumers = normalize_consumers(
        [GOOD, dict(GOOD, name="mail", interval="5s")], {"interval": "30s", "nice": 5}, "jobs-")
    assert [c["spans"]["interval"] for c in consumers] == ["30s", "5s"]
    assert consumers[0]["resources"] == {"Nice": "5"}
    assert consumers[1]["service_unit"] == "jobs-mail.service"


def test_dict_defaults_merge_with_the_consumers_own_which_win():
    defaults = {
        "environment": {"A": "1", "SHARED": "default"},
        "service_options": {"Nice": 5, "SyslogIdentifier": "jobs"},
        "timer_options": {"Persistent": True},
    }
    consumer = normalize_consumers([dict(
        GOOD, environment={"B": "2", "SHARED": "own"}, service_options={"Nice": 7},
        timer_options={"WakeSystem": False})], defaults)[0]
    assert consumer["environment"] == ['"A=1"', '"B=2"', '"SHARED=own"']
    assert consumer["service_options"] == [("Nice", "7"), ("SyslogIdentifier", "jobs")]
    assert consumer["timer_options"] == [("Persistent", "yes"), ("WakeSystem", "no")]
    assert defaults["environment"] == {"A": "1", "SHARED": "default"}  # not changed in place


def test_secret_defaults_merge_the_same_way_in_units_and_files():
    defaults = {"secret_environment": {"DB_PASSWORD": "d", "TOKEN": "default"}}
    consumers = [dict(GOOD, secret_environment={"TOKEN": "own"})]
    assert normalize_consumers(consumers, defaults)[0]["secret_names"] == ["DB_PASSWORD", "TOKEN"]
    assert secret_files(consumers, defaults) == {"/etc/batchq/thumbs.env": 'DB_PASSWORD="d"\nTOKEN="own"\n'}


def test_secrets_only_in_the_defaults_give_every_consumer_a_file():
    consumers = [GOOD, dict(GOOD, name="mail")]
    defaults = {"secret_environment": {"TOKEN": "t"}}
    assert [c["secret_file"] for c in normalize_consumers(consumers, defaults)] == [
        "/etc/batchq/thumbs.env", "/etc/batchq/mail.env"]
    assert sorted(secret_files(consumers, defaults)) == ["/etc/batchq/mail.env", "/etc/batchq/thumbs.env"]


def test_a_dict_over_a_non_dict_default_is_still_validated():
    with pytest.raises(ConsumerSpecError, match="'thumbs': field 'environment'"):
        normalize_consumers([GOOD], {"environment": ["A=1"]})


def test_absent_consumer_needs_no_command():
    consumer = normalize_consumers([{"name": "old", "state": "absent"}])[0]
    assert consumer["exec_start"] is None and consumer["state"] == "absent"


@pytest.mark.parametrize("word, quoted", [
    ("plain", '"plain"'),
    ("two words", '"two words"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("100%", '"100%%"'),
    ("%n", '"%%n"'),
    ("$HOME ${X}", '"$$HOME $${X}"'),
    ("a\\b", '"a\\\\b"'),
    ("", '""'),
])
def test_exec_start_words_are_quoted_against_every_expansion(word, quoted):
    assert systemd_quote(word) == quoted


def test_environment_doubles_percent_but_keeps_dollar():
    assert systemd_environment("A", '50% "$HOME" \\') == '"A=50%% \\"$HOME\\" \\\\"'


def test_paths_reach_systemd_escaped_for_each_settings_own_parser():
    consumer = one(writable_paths=["/srv/with space", '/srv/q"x\\y', "/srv/100%"],
                   working_directory="/srv/pct%nx dir", environment_file="/etc/app [1]/*?%i.env")
    # a space-separated list of quoted words with specifiers
    assert consumer["writable_paths"] == ['"/srv/with space"', '"/srv/q\\"x\\\\y"', '"/srv/100%%"']
    # the rest of the line, unquoted, with specifiers
    assert consumer["working_directory"] == "/srv/pct%%nx dir"
    # the rest of the line with specifiers, then a glob pattern
    assert consumer["environment_file"] == "/etc/app \\[1]/\\*\\?%%i.env"
    # the host checks look for the paths as written
    assert [p["path"] for p in consumer["required_paths"]] == [
        "/usr/bin/process_queue", "/etc/app [1]/*?%i.env", "/srv/pct%nx dir", "/srv/with space", '/srv/q"x\\y', "/srv/100%"]


def test_raw_options_keep_specifiers_and_percent_signs():
    consumer = one(instances=2, service_options={"SyslogIdentifier": "thumbs-%i", "CPUWeight": "idle",
                                                 "MemoryHigh": "80%"})
    assert consumer["service_options"] == [
        ("CPUWeight", "idle"), ("MemoryHigh", "80%"), ("SyslogIdentifier", "thumbs-%i")]


def test_string_command_splits_like_a_shell_and_list_is_kept():
    assert one(command="/bin/echo 'a b' c\\ d")["exec_start"] == '"/bin/echo" "a b" "c d"'
    assert one(command=["/bin/echo", "a b", "$x"])["exec_start"] == '"/bin/echo" "a b" "$$x"'
    # YAML's ">" folds the lines of a long command and ends it with a newline
    assert one(command="/bin/echo a\n")["exec_start"] == '"/bin/echo" "a"'


# (what is wrong, the consumer's fields, words the message must contain)
BAD = [
    ("slash in name", {"name": "a/b"}, ["'a/b'", "'name'"]),
    ("upper case name", {"name": "Thumbs"}, ["'Thumbs'", "'name'"]),
    ("long name", {"name": "x" * 49}, ["'name'"]),
    ("name starts with dash", {"name": "-x"}, ["'name'"]),
    ("bad span", {"interval": "1 fortnight"}, ["'thumbs'", "'interval'", "1 fortnight"]),
    ("zero interval", {"interval": "0"}, ["'thumbs'", "'interval'"]),
    ("implicit infinite timeout", {"timeout": "0"}, ["'thumbs'", "'timeout'", "infinity"]),
    ("infinite interval", {"interval": "infinity"}, ["'thumbs'", "'interval'"]),
    ("implicit infinite stop timeout", {"stop_timeout": "0"}, ["'thumbs'", "'stop_timeout'", "infinity"]),
    ("bad stop timeout", {"stop_timeout": "soon"}, ["'thumbs'", "'stop_timeout'", "soon"]),
    ("absurd span", {"timeout": "99999999999999y"}, ["'thumbs'", "'timeout'", "99999999999999y", "count"]),
    ("relative command", {"command": "process_queue"}, ["'thumbs'", "'command'", "absolute"]),
    ("empty command", {"command": ""}, ["'thumbs'", "'command'", "empty"]),
    ("empty argv", {"command": []}, ["'thumbs'", "'command'", "empty"]),
    ("unbalanced quote", {"command": "/bin/echo 'a"}, ["'thumbs'", "'command'"]),
    ("newline in argument", {"command": ["/bin/echo", "a\nb"]}, ["'command'", "newline"]),
    # a shell would run two commands: the split would make the second line arguments
    ("two lines", {"command": "/bin/echo a\n/bin/echo b\n"}, ["'thumbs'", "'command'", "more than one line"]),
    ("a line break in quotes", {"command": "/bin/echo 'a\rb'"}, ["'thumbs'", "'command'", "more than one line"]),
    ("no command", {"command": None}, ["'thumbs'", "'command'", "required"]),
    ("typo key", {"intervall": "5s"}, ["'thumbs'", "'intervall'"]),
    ("zero instances", {"instances": 0}, ["'instances'"]),
    ("too many instances", {"instances": 65}, ["'instances'"]),
    ("instances as words", {"instances": "three"}, ["'instances'"]),
    ("a range without a backlog", {"instances": {"min": 1, "max": 4}}, ["'instances'", "backlog_exit_code"]),
    ("a range without max", {"instances": {"min": 1}, "backlog_exit_code": 75}, ["'instances'", "min and max"]),
    ("a range upside down", {"instances": {"min": 3, "max": 2}, "backlog_exit_code": 75},
     ["'instances'", "min 3 is more than max 2"]),
    ("a range from 0", {"instances": {"min": 0, "max": 2}, "backlog_exit_code": 75}, ["'instances.min'"]),
    ("a range past the most", {"instances": {"min": 1, "max": 65}, "backlog_exit_code": 75}, ["'instances.max'"]),
    ("a typo in a range", {"instances": {"min": 1, "maximum": 4}, "backlog_exit_code": 75},
     ["'instances'", "maximum"]),
    ("a cooldown as prose", {"instances": {"min": 1, "max": 4, "cooldown": "a while"}, "backlog_exit_code": 75},
     ["'instances.cooldown'"]),
    ("an endless cooldown", {"instances": {"min": 1, "max": 4, "cooldown": "infinity"}, "backlog_exit_code": 75},
     ["'instances.cooldown'", "finite"]),
    ("memory as prose", {"memory_max": "lots"}, ["'memory_max'"]),
    ("cpu without percent", {"cpu_quota": "50"}, ["'cpu_quota'"]),
    ("nice out of range", {"nice": 20}, ["'nice'"]),
    ("io weight zero", {"io_weight": 0}, ["'io_weight'"]),
    ("bad env name", {"environment": {"1A": "x"}}, ["'environment'", "1A"]),
    ("newline in env", {"environment": {"A": "x\ny"}}, ["'environment'", "newline"]),
    ("env not a dict", {"environment": ["A=1"]}, ["'environment'"]),
    ("newline in raw option", {"service_options": {"Nice": "1\nUser=root"}}, ["'service_options'", "newline"]),
    ("lower case raw option", {"timer_options": {"persistent": "yes"}}, ["'timer_options'", "persistent"]),
    ("root with hardening", {"user": "root"}, ["'user'", "allow_root"]),
    ("bad state", {"state": "stopped"}, ["'state'", "stopped"]),
    ("relative env file", {"environment_file": "app.env"}, ["'environment_file'", "absolute"]),
    ("relative writable path", {"writable_paths": ["data"]}, ["'writable_paths'"]),
    ("hardening as prose", {"hardening": "maybe"}, ["'hardening'"]),
    ("raw option continues the line", {"service_options": {"Environment": "A=1 \\"}},
     ["'service_options'", "Environment", "backslash"]),
    ("raw timer option continues the line", {"timer_options": {"OnCalendar": ["daily", "x\\"]}},
     ["'timer_options'", "OnCalendar", "backslash"]),
    ("working directory continues the line", {"working_directory": "/srv/x\\"},
     ["'working_directory'", "backslash"]),
    ("working directory ends in a space", {"working_directory": "/srv/x "}, ["'working_directory'", "white space"]),
    ("environment file ends in a space", {"environment_file": "/etc/x.env "}, ["'environment_file'", "white space"]),
    ("dot-dot in a writable path", {"writable_paths": ["/srv/../etc"]}, ["'writable_paths'", "'..'"]),
    ("relative failure hook", {"on_failure": "notify --to ops"}, ["'thumbs'", "'on_failure'", "absolute"]),
    ("empty recovery hook", {"on_recovery": []}, ["'thumbs'", "'on_recovery'", "empty"]),
    ("hook period as prose", {"on_failure_every": "hourly"}, ["'thumbs'", "'on_failure_every'", "hourly"]),
    ("infinite hook period", {"on_failure_every": "infinity"}, ["'thumbs'", "'on_failure_every'"]),
    ("preload without a drain", {"preload": ["psycopg"]}, ["'thumbs'", "'preload'", "backlog_exit_code"]),
    ("preload as a string", {"preload": "psycopg", "backlog_exit_code": 75}, ["'thumbs'", "'preload'", "list"]),
    ("preload of a path", {"preload": ["app/jobs.py"], "backlog_exit_code": 75}, ["'preload'", "app/jobs.py"]),
    ("preload of python3 -c", {"preload": ["json"], "backlog_exit_code": 75, "command": "/usr/bin/python3 -c 1"},
     ["'thumbs'", "'command'", "-m MODULE"]),
    ("preload of the module it runs", {"preload": ["app.consume"], "backlog_exit_code": 75,
                                       "command": "/usr/bin/python3 -m app.consume"}, ["'preload'", "app.consume"]),
    ("preload of -m without a module", {"preload": ["json"], "backlog_exit_code": 75,
                                        "command": "/usr/bin/python3 -m"}, ["'command'", "-m MODULE"]),
]


@pytest.mark.parametrize("fields, words", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_consumers_name_consumer_and_field(fields, words):
    with pytest.raises(ConsumerSpecError) as error:
        normalize_consumers([dict(GOOD, **fields)])
    for word in words:
        assert word in str(error.value)


# A trailing newline, or any control character, would reach a unit name or end a
# unit file line early: each is refused on the controller, naming consumer and field.
# (the consumer's fields, the field the message must name)
CONTROL = [
    ({"user": "batchq\n"}, "user"),
    ({"group": "batchq\n"}, "group"),
    ({"service_options": {"Nice\n": 5}}, "service_options"),
    ({"timer_options": {"Persistent\n": True}}, "timer_options"),
    ({"service_options": {"Nice": "5\t"}}, "service_options"),
    ({"memory_max": "512M\n"}, "memory_max"),
    ({"cpu_quota": "50%\n"}, "cpu_quota"),
    ({"tasks_max": "infinity\n"}, "tasks_max"),
    ({"environment": {"A\n": "x"}}, "environment"),
    ({"environment": {"A": "x\x1b[31m"}}, "environment"),
    ({"secret_environment": {"A\n": "x"}}, "secret_environment"),
    ({"command": ["/bin/echo", "a\tb"]}, "command"),
    ({"on_failure": ["/bin/notify", "\x07"]}, "on_failure"),
    ({"working_directory": "/srv/a\tb"}, "working_directory"),
    ({"environment_file": "/etc/a\x7f.env"}, "environment_file"),
    ({"writable_paths": ["/srv/a\x0bb"]}, "writable_paths"),
] + [({field: "5s\n3s"}, field) for field in ("interval", "start_delay", "accuracy", "jitter", "timeout",
                                              "stop_timeout", "on_failure_every")] + [
    ({"timeout": "5s\t"}, "timeout"),
]


@pytest.mark.parametrize("fields, field", CONTROL, ids=[repr(case[0]) for case in CONTROL])
def test_control_characters_are_refused_naming_consumer_and_field(fields, field):
    with pytest.raises(ConsumerSpecError) as error:
        normalize_consumers([dict(GOOD, **fields)])
    assert "consumer 'thumbs': field %r: " % field in str(error.value)


@pytest.mark.parametrize("name", ["thumbs\n", "thumbs\t", "thu\x7fmbs"])
def test_control_characters_in_the_name_are_refused(name):
    with pytest.raises(ConsumerSpecError, match=r"^consumer %s: field 'name': " % re.escape(repr(name))):
        normalize_consumers([dict(GOOD, name=name)])


def test_a_prefix_with_a_trailing_newline_is_refused():
    with pytest.raises(ConsumerSpecError, match="consumer_unit_prefix"):
        normalize_consumers([GOOD], {}, "batchq-\n")


def test_journal_rate_limits_can_be_set_per_consumer():
    """systemd 240+ (every supported Debian) takes them in [Service]."""
    consumer = one(service_options={"LogRateLimitIntervalSec": "30s", "LogRateLimitBurst": 10000})
    assert consumer["service_options"] == [("LogRateLimitBurst", "10000"), ("LogRateLimitIntervalSec", "30s")]


def test_stop_timeout_may_be_infinity_when_written_so():
    assert one(stop_timeout="infinity")["spans"]["stop_timeout"] == "infinity"
    assert one(stop_timeout="5s")["spans"]["stop_timeout"] == "5s"


def test_root_is_allowed_when_asked_for_or_without_hardening():
    assert one(user="root", allow_root=True)["user"] == "root"
    assert one(user="root", hardening=False)["user"] == "root"


def test_duplicate_names_are_refused():
    with pytest.raises(ConsumerSpecError, match="'thumbs': field 'name': is used by more than one"):
        normalize_consumers([GOOD, GOOD])


@pytest.mark.parametrize("consumers, defaults, prefix, words", [
    ({"name": "x"}, {}, "batchq-", ["must be a list"]),
    (["x"], {}, "batchq-", ["must be a dict"]),
    ([GOOD], {"name": "x"}, "batchq-", ["consumer_defaults", "'name'"]),
    ([GOOD], [], "batchq-", ["consumer_defaults must be a dict"]),
    # a key of consumer_defaults is the defaults' fault, not the first consumer's
    ([GOOD], {"timout": "5min"}, "batchq-", ["consumer_defaults: field 'timout': is not a consumer setting"]),
    # an item without a usable name is found by its place in the list
    ([GOOD, {"command": "/bin/true"}], {}, "batchq-", ["consumer_list item 2: field 'name': is required"]),
    ([{"name": 123, "command": "/bin/true"}], {}, "batchq-",
     ["consumer_list item 1: field 'name': must be a string (quote it), got 123"]),
    ([GOOD, dict(GOOD, name="other"), "x"], {}, "batchq-", ["consumer_list item 3: every item must be a dict"]),
    ([GOOD], {}, "Batch", ["consumer_unit_prefix"]),
])
def test_bad_role_variables(consumers, defaults, prefix, words):
    with pytest.raises(ConsumerSpecError) as error:
        normalize_consumers(consumers, defaults, prefix)
    for word in words:
        assert word in str(error.value)


def test_required_paths_are_listed_for_the_host_check():
    consumer = one(environment_file="/etc/app.env", writable_paths=["/srv/out"])
    assert consumer["required_paths"] == [
        {"field": "command", "path": "/usr/bin/process_queue"},
        {"field": "environment_file", "path": "/etc/app.env"},
        {"field": "writable_paths", "path": "/srv/out"},
    ]


def test_secret_values_stay_out_of_the_normalised_consumer():
    consumer = one(secret_environment={"TOKEN": "hunter2"})
    assert "hunter2" not in repr(consumer)
    assert (consumer["secret_names"], consumer["secret_file"]) == (["TOKEN"], "/etc/batchq/thumbs.env")


def test_secret_files_escape_for_systemd_environment_files():
    files = secret_files([dict(GOOD, secret_environment={"B": 'say "hi" $HOME `id` \\ 100%', "A": 1})])
    assert files == {"/etc/batchq/thumbs.env": 'A="1"\nB="say \\"hi\\" \\$HOME \\`id\\` \\\\ 100%"\n'}


def test_account_and_secrets_folder_come_from_consumer_names():
    """Defined once, in consumer_names: the spec module spells neither out itself."""
    from ansible_collections.batchq.consumers.plugins.module_utils import consumer_spec

    source = pathlib.Path(consumer_spec.__file__).read_text()
    assert '"%s"' % DEFAULT_ACCOUNT not in source and '"%s"' % SECRETS_DIR not in source
    consumer = one(secret_environment={"A": "x"})
    assert (consumer["user"], consumer["group"]) == (DEFAULT_ACCOUNT, DEFAULT_ACCOUNT)
    assert consumer["secret_file"] == SECRETS_DIR + "/thumbs.env"
    assert list(secret_files([dict(GOOD, secret_environment={"A": "x"})])) == [SECRETS_DIR + "/thumbs.env"]


def test_secret_files_only_for_consumers_that_keep_units():
    consumers = [dict(GOOD, secret_environment={"A": "x"}, state="absent"), dict(GOOD, name="plain")]
    assert secret_files(consumers) == {}


@pytest.mark.parametrize("secrets, words", [
    ({"A": "x\ny"}, ["'secret_environment'", "newline"]),
    ({"A-B": "x"}, ["'secret_environment'", "A-B"]),
    ({"A": None}, ["'secret_environment'", "string"]),
    (["A=x"], ["'secret_environment'", "dict"]),
])
def test_bad_secrets_are_refused_without_echoing_them(secrets, words):
    with pytest.raises(ConsumerSpecError) as error:
        normalize_consumers([dict(GOOD, secret_environment=secrets)])
    for word in words:
        assert word in str(error.value)
    assert "x\ny" not in str(error.value)


@pytest.mark.parametrize("value", [0, 256, "more", True, 1.5, 75.0, -1, 1, 2, 126, 127, 200, 255])
def test_bad_backlog_exit_codes_are_refused(value):
    with pytest.raises(ConsumerSpecError) as error:
        normalize_consumers([dict(GOOD, backlog_exit_code=value)])
    assert "'thumbs'" in str(error.value) and "'backlog_exit_code'" in str(error.value)


def test_backlog_exit_code_and_each_batch_timeout():
    consumer = one(backlog_exit_code=75, timeout="2min 30s", stop_timeout="5s")
    assert (consumer["backlog_exit_code"], consumer["timeout_usec"], consumer["stop_timeout_usec"]) == (
        75, 150000000, 5000000)
    assert one(backlog_exit_code="3", timeout="infinity")["timeout_usec"] == 0
    assert one()["backlog_exit_code"] is None


def test_hooks_reach_the_after_run_script_verbatim_and_their_programs_must_exist():
    consumer = one(on_failure=["/usr/local/bin/notify", "100% $HOME \"x\""], on_failure_every="1min")
    assert consumer["hooks"] == {"every_usec": 60000000, "on_failure": ["/usr/local/bin/notify", "100% $HOME \"x\""],
                                 "on_recovery": None}
    assert {"field": "on_failure", "path": "/usr/local/bin/notify"} in consumer["required_paths"]
    assert one()["hooks"] is None


def test_a_run_fails_with_a_message_when_an_environment_file_is_gone():
    consumer = normalize_consumers([{"name": "mail", "command": "/bin/true", "environment_file": "/etc/app [1]/%i.env",
                                     "secret_environment": {"TOKEN": "t"}}])[0]
    # optional to systemd ("-" in the template), checked by ExecStartPre=+ with every path verbatim
    assert consumer["environment_check"].startswith('"/bin/sh" "-c" "for file; do [ -r \\"$$file\\" ]')
    assert consumer["environment_check"].endswith('"environment-check" "/etc/app [1]/%%i.env" "/etc/batchq/mail.env"')
    assert normalize_consumers([{"name": "mail", "command": "/bin/true"}])[0]["environment_check"] is None


DRAIN = dict(GOOD, backlog_exit_code=75, preload=["psycopg", "app.jobs", "psycopg"])


@pytest.mark.parametrize("command, python, target", [
    ("/opt/app/venv/bin/python -m app.consume --limit 100", '"/opt/app/venv/bin/python"',
     '"-m" "app.consume" "--limit" "100"'),
    ("/usr/bin/python3.11 -u -B /opt/app/consume.py x", '"/usr/bin/python3.11" "-u" "-B"', '"/opt/app/consume.py" "x"'),
    ("/usr/local/bin/process_queue --limit 100", None, None),
])
def test_a_preloaded_command_gives_the_runner_its_python_and_the_batch_its_target(command, python, target):
    consumer = normalize_consumers([dict(DRAIN, command=command)])[0]
    assert consumer["preload"] == ["psycopg", "app.jobs"]
    assert consumer["preload_python"] == python
    if python:
        assert consumer["preload_target"] == target and consumer["preload_script"] is None
    else:  # a script: the host tells its interpreter from its #! line
        assert consumer["preload_script"] == "/usr/local/bin/process_queue"
        assert consumer["preload_target"] == '"/usr/local/bin/process_queue" "--limit" "100"'


def test_a_preloaded_script_given_to_python_must_exist_on_the_host():
    consumer = normalize_consumers([dict(DRAIN, command="/usr/bin/python3 /opt/app/consume.py")])[0]
    assert {"field": "command", "path": "/opt/app/consume.py"} in consumer["required_paths"]


def test_no_preload_is_the_default_and_changes_nothing():
    consumer = normalize_consumers([dict(GOOD, backlog_exit_code=75)])[0]
    assert consumer["preload"] == [] and consumer["preload_python"] is None and consumer["preload_script"] is None


@pytest.mark.parametrize("line, words", [
    ("#!/usr/bin/python3", ["/usr/bin/python3"]),
    ("#!/opt/venv/bin/python -u", ["/opt/venv/bin/python", "-u"]),
    ("#! /usr/bin/python3.9", ["/usr/bin/python3.9"]),
    ("#!/usr/bin/env python3", ["/usr/bin/env", "python3"]),
    ("#!/usr/bin/env -S python3 -I", ["/usr/bin/env", "python3", "-I"]),
    ("#!/bin/sh", None),
    ("#!/usr/bin/env bash", None),
    ("#!/usr/bin/python3 -c", None),
    ("import os", None),
    ("\x7fELF\x02\x01", None),
    ("", None),
    (None, None),
])
def test_shebang_python_knows_the_lines_that_run_python(line, words):
    assert shebang_python(line) == words


def test_preload_pythons_come_from_the_command_or_the_hosts_first_line():
    consumers = normalize_consumers([
        dict(DRAIN, name="venv", command="/opt/venv/bin/python -m app.consume"),
        dict(DRAIN, name="script", command="/usr/local/bin/pgqueue --limit 100"),
        dict(DRAIN, name="shell", command="/usr/local/bin/drain.sh"),
        dict(GOOD, name="plain"),
    ])
    lines = {"/usr/local/bin/pgqueue": "#!/usr/bin/env python3", "/usr/local/bin/drain.sh": "#!/bin/bash"}
    decided = preload_pythons(consumers, lines, "web1")
    assert decided["pythons"] == {"venv": '"/opt/venv/bin/python"', "script": '"/usr/bin/env" "python3"'}
    [problem] = decided["problems"]
    for word in ("'shell'", "'command'", "/usr/local/bin/drain.sh", "web1", "#!/bin/bash"):
        assert word in problem


def test_credentials_become_files_the_unit_loads_and_their_values_stay_out_of_it():
    consumer = one(credentials={"db_password": "hunter2\nline two", "tls.key": "-----BEGIN"},
                   hook_credentials={"webhook_token": "t0ken"}, on_failure="/usr/local/bin/notify")
    assert not re.search("hunter2|BEGIN|t0ken", repr(consumer))
    # in clear text for systemd 247-249, encrypted in a file of another name (a unit of one form never reads the other)
    assert consumer["credentials"] == {
        "credentials": [{"name": "db_password", "path": "/etc/batchq/thumbs.db_password.cred",
                         "encrypted_path": "/etc/batchq/thumbs.db_password.cred-encrypted"},
                        {"name": "tls.key", "path": "/etc/batchq/thumbs.tls.key.cred",
                         "encrypted_path": "/etc/batchq/thumbs.tls.key.cred-encrypted"}],
        "hook_credentials": [{"name": "webhook_token", "path": "/etc/batchq/thumbs.webhook_token.hookcred",
                              "encrypted_path": "/etc/batchq/thumbs.webhook_token.hookcred-encrypted"}]}
    # the batch's secrets, whose change ends a running drain; a hook reads its own at each start
    assert consumer["secret_paths"] == [
        "/etc/batchq/thumbs.db_password.cred", "/etc/batchq/thumbs.db_password.cred-encrypted",
        "/etc/batchq/thumbs.tls.key.cred", "/etc/batchq/thumbs.tls.key.cred-encrypted"]


def test_credential_files_hold_the_values_as_given_and_defaults_merge_key_by_key():
    defaults = {"credentials": {"shared": "s", "db_password": "default"}}
    consumers = [dict(GOOD, credentials={"db_password": "own\n"}), dict(GOOD, name="gone", state="absent")]
    assert credential_files(consumers, defaults) == [
        {"path": "/etc/batchq/thumbs.db_password.cred", "name": "db_password", "value": "own\n"},
        {"path": "/etc/batchq/thumbs.shared.cred", "name": "shared", "value": "s"}]
    assert [f["path"] for f in credential_files(consumers, defaults, encrypted=True)] == [
        "/etc/batchq/thumbs.db_password.cred-encrypted", "/etc/batchq/thumbs.shared.cred-encrypted"]


@pytest.mark.parametrize("field", ["credentials", "hook_credentials"])
@pytest.mark.parametrize("value, problem", [
    ({"db/password": "x"}, "'db/password' is not a credential name"),
    ({".hidden": "x"}, "'.hidden' is not a credential name"),
    ({"x" * 129: "x"}, "is not a credential name: 1-128 letters"),
    ({"pin": 1234}, "value of pin must be a string, got int (quote it, or template it with | string)"),
    ({"blob": b"bytes"}, "value of blob must be a string, got bytes"),
    ({"when": __import__("datetime").date(2026, 12, 2)}, "value of when must be a string, got date"),
    ({"flag": True}, "value of flag must be a string, got bool"),
    ({"missing": None}, "value of missing must be a string, got NoneType"),
    ({"nested": {"a": "b"}}, "value of nested must be a string, got dict"),
    (["db_password"], "must be a dict of NAME: secret value"),
    ({"big": "x" * (1024 * 1024 + 1)}, "larger than 1 MiB together"),
])
def test_bad_credentials_are_refused_naming_the_consumer_and_field_not_the_value(field, value, problem):
    with pytest.raises(ConsumerSpecError) as error:
        one(**{field: value, "on_failure": "/usr/local/bin/notify"})
    assert str(error.value).startswith("consumer 'thumbs': field '%s': " % field) and problem in str(error.value)
    assert "1234" not in str(error.value)


def test_hook_credentials_without_a_hook_are_refused():
    with pytest.raises(ConsumerSpecError, match="field 'hook_credentials': needs on_failure or on_recovery"):
        one(hook_credentials={"token": "t"})


def test_a_slice_of_its_own_is_refused_the_budget_holds_every_consumer():
    with pytest.raises(ConsumerSpecError, match="field 'service_options': Slice is the role's: every consumer runs"
                                                " in batchq.slice, capped by consumer_budget"):
        one(service_options={"Slice": "system.slice"})


@pytest.mark.parametrize("setting", ["ExecStartPre", "ExecStopPost"])
def test_an_empty_exec_setting_that_would_drop_the_roles_commands_is_refused(setting):
    with pytest.raises(ConsumerSpecError, match="field 'service_options': an empty %s would remove the role's own"
                                                " commands" % setting):
        one(service_options={setting: ""})
    assert one(service_options={setting: "/bin/true"})["service_options"] == [(setting, "/bin/true")]


@pytest.mark.parametrize("key", ["User", "Group", "DynamicUser"])
def test_an_account_of_service_options_is_refused_the_user_and_group_keys_are_checked(key):
    # User=root here would run the batch as root with hardening on and no allow_root
    with pytest.raises(ConsumerSpecError, match="field 'service_options': %s is the role's: set the consumer's user"
                                                " and group keys instead" % key):
        one(service_options={key: "root"})
