"""Shared fixtures of the queue tests: the examples and the tests' one wait (tests/unit/waiting.py) on
sys.path, a moto server."""

import argparse
import os
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARY = os.path.join(TOP, "examples", "queue_library")
SQS = os.path.join(TOP, "examples", "sqs_queue")
SPOOL = os.path.join(TOP, "examples", "spool_queue")
sys.path[:0] = [LIBRARY, SQS, SPOOL]
sys.path.append(os.path.join(TOP, "tests", "unit"))
from waiting import wait_for  # noqa: E402  # pylint: disable=wrong-import-position


def parsed_options(defaults, changes):
    """The library's common options as main() parses them with no argument,
    then the test file's defaults, then the test's own changes."""
    # imported here: it is importable only once LIBRARY is on sys.path, above
    import batchq_queue  # pylint: disable=import-outside-toplevel
    parser = argparse.ArgumentParser()
    batchq_queue.add_common_options(parser)
    args = parser.parse_args([])
    vars(args).update(defaults, **changes)
    return args


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(autouse=True)
def no_aws_environment(monkeypatch):
    """No test reads real credentials, nor asks an instance's metadata service."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)


@pytest.fixture(scope="session")
def moto_url(tmp_path_factory):
    """A moto server on a free port of 127.0.0.1, killed at the end whatever happened."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")
    server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"),
                               "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = "http://127.0.0.1:%d" % port

    def answers():
        if server.poll() is not None:
            raise RuntimeError("moto_server ended with %s" % server.returncode)
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
        except OSError:
            return False
        return True

    try:
        wait_for(answers, 30, "moto_server to answer on %s" % url)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        log.close()


@pytest.fixture
def credentials(tmp_path, monkeypatch):
    """A systemd credentials folder with an AWS shared-credentials file, as the role gives it."""
    folder = tmp_path / "credentials"
    folder.mkdir()
    (folder / "aws").write_text("[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(folder))
    return folder


def alive(pid):
    """Whether process pid runs: a zombie has ended, though /proc still shows it until it is reaped."""
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def guide_consumer(heading):
    """The first Python block of the writing guide's section that heading opens, as a program's text."""
    with open(os.path.join(TOP, "docs", "docsite", "rst", "guide_writing.rst"), encoding="utf-8") as handle:
        section = handle.read().split(heading + "\n")[1]
    lines = section.split(".. code-block:: python\n\n")[1].splitlines()
    block = lines[:next(n for n, line in enumerate(lines) if line and not line.startswith("   "))]
    return "\n".join(line[3:] for line in block).strip() + "\n"
