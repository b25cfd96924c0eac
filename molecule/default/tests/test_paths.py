"""Paths with a space, '%' and glob characters reach systemd escaped: the
batch works in, writes to and reads its environment from exactly those."""

from testlib import consumer_spec, journal, wait_for

# The consumers with a short interval whose timers run during these tests (conftest.py): none.
WATCHES = ()


def test_working_directory_writable_path_and_environment_file_are_the_ones_written(host):
    spec = consumer_spec("paths")
    seen = host.file(spec["writable_paths"][0] + "/seen")
    wait_for(lambda: seen.exists, 30, "the paths consumer to write into %r" % spec["writable_paths"][0])
    marker = host.file(spec["working_directory"] + "/marker").content_string.strip()
    variable = host.file(spec["environment_file"]).content_string.strip().split("=", 1)[1]
    assert seen.content_string.splitlines() == [spec["working_directory"], marker, variable], journal(host, "paths")
