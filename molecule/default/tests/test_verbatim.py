"""What the user writes in command and environment reaches the process as written."""

from testlib import consumer_spec, finished, journal, runs, scenario_vars, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()


def echoed(host, name):
    return wait_for(lambda: finished(runs(host, name)), 30, "a finished run of " + name)[0]


def test_list_command_and_environment_arrive_verbatim(host):
    spec = consumer_spec("verbatim")
    run = echoed(host, "verbatim")
    assert run["argv"] == spec["command"][2:], journal(host, "verbatim")
    # consumer_defaults' environment lies under the consumer's own
    expected = dict(scenario_vars()["consumer_defaults"]["environment"], **spec["environment"])
    assert run["environment"] == expected, journal(host, "verbatim")


def test_string_command_is_split_like_a_shell(host):
    run = echoed(host, "shellwords")
    assert run["argv"] == ["one arg", "it's", "plain escaped", "$HOME%i"], journal(host, "shellwords")


def test_consumer_knows_its_name_and_state_directory(host):
    out = host.check_output("systemctl show batchq-verbatim.service -p Environment -p StateDirectory")
    assert "BATCHQ_CONSUMER=verbatim" in out
    assert "StateDirectory=batchq/verbatim" in out
