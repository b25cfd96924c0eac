"""Each task of the shipped playbooks that runs one of the collection's
modules on a host runs it as root. A module that reads systemd as the login
user needs D-Bus, which a bare Debian lacks, and the journal needs root."""

import pathlib

import pytest
import yaml

PLAYBOOKS = sorted((pathlib.Path(__file__).parents[2] / "playbooks").glob("*.yml"))
MODULE_PREFIX = "batchq.consumers."


def module_tasks(play):
    """(name, become) of each task of play that calls a module of the collection."""
    for task in play.get("tasks", []):
        modules = [key for key in task if key.startswith(MODULE_PREFIX)]
        if modules:
            yield task.get("name", modules[0]), task.get("become", play.get("become", False))


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=[path.name for path in PLAYBOOKS])
def test_every_module_task_of_a_playbook_runs_as_root(playbook):
    plays = yaml.safe_load(playbook.read_text())
    found = [(play.get("name"), name, become) for play in plays if "hosts" in play
             for name, become in module_tasks(play)]
    assert [entry for entry in found if entry[2] is not True] == []
    if playbook.name in ("consumer_control.yml", "consumer_status.yml"):
        assert found, "no module task found in %s: the test reads the wrong keys" % playbook.name
