"""An example folder copied alone into a project of the user's still works.

Users copy examples/sqs_queue, examples/spool_queue or examples/postgresql_queue
into their own project. Every playbook in the copy must then find what it
imports: the collection's playbooks by name, and only the files of its own
folder by path. ansible-playbook --syntax-check loads each playbook and every
playbook it imports, with the collection installed as users install it.
"""

import os
import pathlib
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).parents[2]
FOLDERS = ["awx_project", "postgresql_queue", "spool_queue", "sqs_queue"]


def playbooks(folder):
    """The files of folder that are playbooks: a list of plays, each with hosts or an import."""
    found = []
    for path in sorted(folder.glob("*.yml")):
        document = yaml.safe_load(path.read_text())
        if isinstance(document, list) and all(
                isinstance(play, dict) and ("hosts" in play or "ansible.builtin.import_playbook" in play)
                for play in document):
            found.append(path.name)
    return found


@pytest.mark.parametrize("name", FOLDERS)
def test_an_example_folder_copied_alone_finds_what_its_playbooks_import(name, tmp_path):
    copy = tmp_path / "project" / name
    shutil.copytree(ROOT / "examples" / name, copy)
    names = playbooks(copy)
    assert "deploy.yml" in names
    done = subprocess.run(["ansible-playbook", "--syntax-check", "-i", "localhost,", *names], cwd=copy,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=dict(os.environ, ANSIBLE_FORCE_COLOR="false"), check=False)
    assert done.returncode == 0, done.stdout
