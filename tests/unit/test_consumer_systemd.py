"""Which hosts the role deploys to, and what it leaves out, from `systemctl --version`
as recorded on Debian 11, 12, 13 and testing (tests/unit/fixtures/SUITE/systemctl-version.txt)."""

import pathlib

import pytest

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_systemd import (
    MINIMUM,
    SystemdVersionError,
    systemd_support,
    systemd_version,
)

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def recorded(suite):
    return (FIXTURES / suite / "systemctl-version.txt").read_text()


@pytest.mark.parametrize("suite, version", [("bullseye", 247), ("bookworm", 252), ("trixie", 257), ("forky", 262)])
def test_version_of_each_recorded_debian(suite, version):
    assert systemd_version(recorded(suite)) == version


def test_every_tested_debian_is_deployed_to():
    for suite in ("bullseye", "bookworm", "trixie", "forky"):
        assert systemd_support(recorded(suite), "h")["refusal"] == ""


def test_the_oldest_supported_is_247():
    assert MINIMUM == 247
    assert systemd_support("systemd 247 (247)\n")["refusal"] == ""


def test_an_older_systemd_is_refused_naming_found_and_needed():
    # Ubuntu 20.04's systemd, as its systemctl --version begins
    decision = systemd_support("systemd 245 (245.4-4ubuntu3.24)\n+PAM +AUDIT\n", "old-host")
    assert decision["version"] == 245
    assert decision["refusal"] == ("old-host has systemd 245; the batchq.consumers.consumer role "
                                   "needs systemd 247 or later")


def test_the_drain_continuation_and_encrypted_credentials_from_250_on():
    before = dict.fromkeys(("drain_continue", "credentials_encrypted", "credentials_private_run", "slice_concurrency",
                            "credentials_before_start"), False)
    since = dict(before, drain_continue=True, credentials_encrypted=True)
    assert systemd_support(recorded("bullseye"))["features"] == before
    assert systemd_support("systemd 249 (249.11-0ubuntu3.12)\n")["features"] == before
    assert systemd_support("systemd 250 (250.3)\n")["features"] == since
    assert systemd_support(recorded("bookworm"))["features"] == dict(since, credentials_before_start=True)


def test_a_slice_queues_starts_beyond_its_running_cap_from_258_on():
    assert not systemd_support(recorded("trixie"))["features"]["slice_concurrency"]
    assert not systemd_support("systemd 257 (257.9-1~deb13u1)\n")["features"]["slice_concurrency"]
    assert systemd_support("systemd 258 (258.1-1)\n")["features"]["slice_concurrency"]
    assert systemd_support(recorded("forky"))["features"]["slice_concurrency"]


def test_output_without_a_version_is_refused_not_guessed():
    decision = systemd_support("bash: systemctl: command not found\n", "h")
    assert decision["version"] is None
    assert decision["refusal"].startswith("h: no systemd version in `systemctl --version`")
    assert not any(decision["features"].values())
    with pytest.raises(SystemdVersionError):
        systemd_version("")
    # a two-digit number after "systemd" in another word is no version
    with pytest.raises(SystemdVersionError):
        systemd_version("systemd-container 99\n")
