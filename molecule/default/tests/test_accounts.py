"""Accounts are looked up by name, not by listing whole databases: a
directory service need not list its users, and the host's facts stay small."""

import os
import subprocess
import tempfile

import yaml

from testlib import INVENTORY, consumers

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()

CHECKS = """
- name: Run the role's checks, then look at what they left in the facts
  hosts: consumers
  gather_facts: false
  tasks:
    - name: Run the checks
      ansible.builtin.include_role:
        name: batchq.consumers.consumer
        tasks_from: preflight
    - name: Show the getent facts
      ansible.builtin.debug:
        msg: "GETENT_FACTS={{ ansible_facts | dict2items | map(attribute='key') | select('match', 'getent') | list | to_json }}"
"""


def run_checks(consumer_list):
    with tempfile.TemporaryDirectory(prefix="batchq-test-") as folder:
        playbook, extra = os.path.join(folder, "checks.yml"), os.path.join(folder, "vars.yml")
        with open(playbook, "w") as handle:
            handle.write(CHECKS)
        with open(extra, "w") as handle:
            yaml.safe_dump({"consumer_list": consumer_list}, handle)
        return subprocess.run(["ansible-playbook", "-i", INVENTORY, "-e", "@" + extra, playbook], check=False,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)


def test_existing_accounts_pass_and_no_database_becomes_a_fact(hosts):
    # an account Debian has but the role does not create
    other = {"name": "other-account", "command": "/usr/local/bin/batchq-probe run", "user": "daemon",
             "group": "daemon"}
    process = run_checks(consumers() + [other])
    assert process.returncode == 0, process.stdout
    facts = [line for line in process.stdout.splitlines() if "GETENT_FACTS=" in line]
    assert len(facts) == len(hosts), process.stdout
    assert all(line.strip().endswith('GETENT_FACTS=[]"') for line in facts), "\n".join(facts)


def test_a_missing_group_is_named_with_consumer_and_field(hosts):
    stranger = {"name": "stranger", "command": "/usr/local/bin/batchq-probe run", "user": "daemon",
                "group": "no-such-group"}
    process = run_checks(consumers() + [stranger])
    assert process.returncode != 0, process.stdout
    assert "consumer 'stranger': field 'group': no group entry no-such-group" in process.stdout, process.stdout
