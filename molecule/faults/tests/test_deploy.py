"""A deploy during a batch: the batch is not killed, the next run is new."""

import pytest

from testlib import redeploy_during_a_held_batch

# The consumers whose timers run during these tests (conftest.py): the others wait.
WATCHES = ()  # "long" alone, started by the test itself


@pytest.mark.usefixtures("release_held_batch")
def test_deploy_with_a_changed_command_during_a_batch(hosts):
    redeploy_during_a_held_batch(hosts)
