"""consumer_defaults lie under every consumer; their dicts merge with the
consumer's own, the consumer's values winning."""

from testlib import finished, journal, runs, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()


def test_environment_of_the_defaults_and_the_consumer_both_reach_the_batch(host):
    run = wait_for(lambda: finished(runs(host, "merged")), 30, "a finished run of merged")[0]
    assert run["environment"] == {
        "PROBE_FROM_DEFAULTS": "every consumer",
        "PROBE_OWN": "its own",
        "PROBE_OVERRIDDEN": "by the consumer",
    }, journal(host, "merged")
