"""Makes molecule/testlib.py importable from every scenario's tests."""

import pytest

from testlib import FIGURES, all_hosts, release_held


@pytest.fixture(scope="module")
def hosts():
    return all_hosts()


@pytest.fixture
def release_held_batch(hosts):
    yield
    release_held(hosts)


def pytest_terminal_summary(terminalreporter):
    """The figures the tests measured, for the README and closing notes."""
    for text in FIGURES:
        terminalreporter.write_line("FIGURE " + text)
