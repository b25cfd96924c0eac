"""Makes molecule/testlib.py importable from every scenario's tests."""

import pytest

from testlib import all_hosts


@pytest.fixture(scope="module")
def hosts():
    return all_hosts()
