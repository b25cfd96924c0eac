"""ansible-pull as a way to deploy: the host pulls a git repository that holds
a playbook importing batchq.consumers.deploy_consumers, its inventory and its
consumers, and deploys its own consumers, with the same validation before
anything changes (the AWX guide, "Hosts that deploy themselves").

The repository is a bare one on the host itself, published from a work tree
of this machine: no network. pull_host.py installs git, ansible-core and the
collection's tarball on the host from this machine's downloads. It runs on
Debian 11 (ansible-core 2.15 in a venv: the newest for its Python 3.9) and
Debian 13 (Debian's own ansible-core 2.19): the parts of compat under 2.16
and 2.19. Each host costs about a minute (the installs most of it), so the
other releases' parts skip it, saying so.
"""

import os
import pathlib
import subprocess

import pytest
import yaml

import pull_host
from testlib import PREFIX, host_state, show, wait_for

TESTED = {"bullseye": "Debian 11", "trixie": "Debian 13"}
# The checkout that ansible-pull updates and runs the playbook from.
CHECKOUT = "/var/lib/batchq-pull"
# a consumer of its own: the scenario's stay as converge deployed them (the role leaves unlisted ones)
PULLED = {"name": "pulled", "command": ["/bin/echo", "pulled"], "interval": "1h", "start_delay": "1s"}


class Repository:
    """The git work tree on this machine whose commits the host pulls."""

    def __init__(self, path, hostname):
        self.path, self.hostname = path, hostname
        self.git("init", "--quiet", "--initial-branch=main")

    def git(self, *arguments):
        return subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", *arguments],
                              cwd=self.path, check=True, stdout=subprocess.PIPE, text=True).stdout.strip()

    def commit(self, consumer_list, message):
        files = {
            "local.yml": [{"name": "Deploy this host's consumers",
                           "ansible.builtin.import_playbook": "batchq.consumers.deploy_consumers"}],
            # every host of the fleet; ansible-pull limits the run to the host it runs on
            "inventory.yml": {"consumers": {"hosts": {self.hostname: None, "elsewhere.invalid": None}}},
            # root's timer runs it on the host itself: no SSH, no sudo
            "group_vars/consumers.yml": {"ansible_connection": "local", "ansible_become": False,
                                         "ansible_python_interpreter": "/usr/bin/python3"},
            "host_vars/%s.yml" % self.hostname: {"consumer_list": consumer_list},
            # another host's list, wrong: this host never validates it
            "host_vars/elsewhere.invalid.yml": {"consumer_list": [{"name": "other", "command": "/bin/true",
                                                                   "intervall": "1h"}]},
        }
        for name, content in files.items():
            path = self.path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("---\n" + yaml.safe_dump(content, sort_keys=False))
        self.git("add", "--all")
        self.git("commit", "--quiet", "--allow-empty", "--message", message)
        return self.git("rev-parse", "HEAD")


class Puller:
    """A host made ready for ansible-pull, and its repository."""

    def __init__(self, host, work):
        self.host, self.container = host, host.backend.get_hostname()
        tarball = next(pathlib.Path(os.environ["BATCHQ_CACHE"], "build").glob("batchq-consumers-*.tar.gz"))
        self.bin = pull_host.prepare(self.container, tarball, pathlib.Path(os.environ["BATCHQ_CACHE"], "pull"))
        self.repository = Repository(work, host.check_output("hostname"))

    def pull(self, consumer_list, message):
        """Commit consumer_list, publish, run ansible-pull as root's timer would
        (from /, no terminal); returns (the commit, returncode, output)."""
        commit = self.repository.commit(consumer_list, message)
        bare = pull_host.publish(self.container, self.repository.path)
        returncode, output = pull_host.on_host(
            self.container, "cd / && %s/ansible-pull --url %s --directory %s --inventory inventory.yml local.yml"
            % (self.bin, bare, CHECKOUT), check=False)
        return commit, returncode, output


@pytest.fixture(scope="module")
def pullers():
    return {}


@pytest.fixture
def puller(host, pullers, tmp_path_factory):
    release = pull_host.release_of(host.backend.get_hostname())
    if release not in TESTED:
        pytest.skip("ansible-pull is tested on %s (compat's parts under 2.16 and 2.19), not %s"
                    % (" and ".join(TESTED.values()), release))
    name = host.backend.get_hostname()
    if name not in pullers:
        pullers[name] = Puller(host, tmp_path_factory.mktemp("pull-repository"))
    return pullers[name]


def test_a_host_pulls_its_repository_and_deploys_its_own_consumers(puller, host):
    commit, returncode, output = puller.pull([PULLED], "the pulled consumer")
    assert returncode == 0, output
    # the other host's wrong list did not stop this one: ansible-pull limits the run to this host
    assert "elsewhere.invalid" not in output.split("PLAY RECAP")[-1], output
    # ansible-core 2.15, the only one Debian 11's Python runs, is below the collection's
    # requires_ansible (2.16): it warns, and the test proves that the deploy works all the same
    warned = "Collection batchq.consumers does not support Ansible version" in output
    assert warned == (pull_host.release_of(puller.container) == "bullseye"), output
    assert host.check_output("git -C %s rev-parse HEAD", CHECKOUT) == commit
    # start_delay 1s: the deploy scheduled the timer's start a second later, and its first run
    wait_for(lambda: show(host, PREFIX + "pulled.service", "ExecMainExitTimestamp")["ExecMainExitTimestamp"],
             60, "the first run of the pulled consumer")
    assert show(host, PREFIX + "pulled.service", "Result", "ExecMainStatus") == {
        "Result": "success", "ExecMainStatus": "0"}
    assert show(host, PREFIX + "pulled.timer", "ActiveState", "UnitFileState") == {
        "ActiveState": "active", "UnitFileState": "enabled"}
    # a new commit with the same consumers changes nothing
    commit, returncode, output = puller.pull([PULLED], "the same consumers again")
    assert returncode == 0 and "changed=0 " in output.split("PLAY RECAP")[-1], output
    assert host.check_output("git -C %s rev-parse HEAD", CHECKOUT) == commit


def test_a_wrong_consumer_in_the_pulled_repository_changes_nothing(puller, host):
    before = host_state(host)
    changed = dict(PULLED, command=["/bin/echo", "changed"])
    wrong = {"name": "second", "command": "/bin/true", "intervall": "1h"}
    commit, returncode, output = puller.pull([changed, wrong], "a change and a wrong consumer")
    assert returncode != 0, output
    assert "consumer 'second': field 'intervall': is not a consumer setting" in output, output
    # the new commit was checked out: validation refused it, not the checkout
    assert host.check_output("git -C %s rev-parse HEAD", CHECKOUT) == commit
    assert host_state(host) == before, output


def test_a_consumer_removed_from_the_pulled_repository_goes(puller, host):
    commit, returncode, output = puller.pull([dict(PULLED, state="absent")], "the pulled consumer goes")
    assert returncode == 0, output
    assert host.check_output("git -C %s rev-parse HEAD", CHECKOUT) == commit
    assert host.run("ls /etc/systemd/system/%spulled.*", PREFIX).stdout == ""
    assert show(host, PREFIX + "pulled.timer", "LoadState") == {"LoadState": "not-found"}
