"""What several unit test files share."""

import contextlib
import json

import pytest

from ansible.module_utils import basic

try:
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # ansible-core before 2.19 reads a module's arguments from basic._ANSIBLE_ARGS

    @contextlib.contextmanager
    def patch_module_args(args):
        saved = basic._ANSIBLE_ARGS
        basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode()
        try:
            yield
        finally:
            basic._ANSIBLE_ARGS = saved


@pytest.fixture
def module_args():
    """A context manager that gives a module's main() these arguments, on every ansible-core."""
    return patch_module_args
