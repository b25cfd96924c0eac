"""What the role removes from a host, from the files it finds there."""

from ansible_collections.batchq.consumers.plugins.module_utils.consumer_cleanup import leftovers, stale_secrets
from ansible_collections.batchq.consumers.plugins.module_utils.consumer_spec import normalize_consumers

D = "/etc/systemd/system"
WANTS = D + "/timers.target.wants"


def consumers(*items):
    return normalize_consumers([dict({"command": "/bin/true"}, **item) for item in items])


def test_nothing_to_do_when_the_host_matches():
    found = [D + "/batchq-a.service", D + "/batchq-a.timer", WANTS + "/batchq-a.timer", D + "/batchq-a.service.d"]
    assert leftovers(found, consumers({"name": "a"})) == {"stop": [], "drain": [], "remove": [], "removed": []}


def test_absent_consumer_goes_entirely_with_drop_ins_and_symlinks():
    found = [D + "/batchq-a.service", D + "/batchq-a.timer", WANTS + "/batchq-a.timer", D + "/batchq-a.service.d",
             D + "/batchq-b.service"]
    result = leftovers(found, consumers({"name": "a", "state": "absent"}, {"name": "b"}))
    assert result["removed"] == ["a"]
    assert result["remove"] == sorted(found[:4])
    # only the shape found on the host: systemd answers 5 for a stop of a unit it does not know
    assert result["stop"] == ["batchq-a.*start.timer", "batchq-a.time[r]"]
    assert result["drain"] == ["batchq-a.service", "batchq-a@*.service"]


def test_unlisted_consumers_stay_unless_exclusive():
    found = [D + "/batchq-stray.service", D + "/batchq-stray.timer", D + "/batchq-a.service", D + "/other.service"]
    assert leftovers(found, consumers({"name": "a"}))["remove"] == []
    result = leftovers(found, consumers({"name": "a"}), exclusive=True)
    assert result["removed"] == ["stray"]
    assert result["remove"] == [D + "/batchq-stray.service", D + "/batchq-stray.timer"]


def test_fewer_instances_stop_the_extra_timers_only():
    found = [D + "/batchq-a@.service", D + "/batchq-a@.timer"] + [WANTS + "/batchq-a@%d.timer" % i for i in (1, 2, 3)]
    result = leftovers(found, consumers({"name": "a", "instances": 2}))
    assert result == {"stop": ["batchq-a.3.start.time[r]", "batchq-a@3.time[r]"], "drain": ["batchq-a@3.service"],
                      "remove": [WANTS + "/batchq-a@3.timer"], "removed": []}


def test_switching_to_instances_retires_the_plain_units():
    found = [D + "/batchq-a.service", D + "/batchq-a.timer", WANTS + "/batchq-a.timer", D + "/batchq-a@.service"]
    result = leftovers(found, consumers({"name": "a", "instances": 2}))
    assert result["stop"] == ["batchq-a.*start.timer", "batchq-a.start.time[r]", "batchq-a.time[r]"]
    assert result["drain"] == ["batchq-a.service"]
    assert result["remove"] == [D + "/batchq-a.service", D + "/batchq-a.timer", WANTS + "/batchq-a.timer"]
    assert result["removed"] == []


def test_names_sharing_a_beginning_are_told_apart():
    found = [D + "/batchq-a-b.service", D + "/batchq-a.service"]
    result = leftovers(found, consumers({"name": "a"}, {"name": "a-b", "state": "absent"}))
    assert result["remove"] == [D + "/batchq-a-b.service"]


def test_removing_a_consumer_with_instances_names_no_plain_unit():
    found = [D + "/batchq-a@.service", D + "/batchq-a@.timer", WANTS + "/batchq-a@1.timer", WANTS + "/batchq-a@2.timer"]
    result = leftovers(found, consumers({"name": "a", "state": "absent"}))
    assert result["stop"] == ["batchq-a.*start.timer", "batchq-a@*.timer"]
    assert result["remove"] == sorted(found)


def test_stop_patterns_match_only_their_own_unit():
    import fnmatch
    from ansible_collections.batchq.consumers.plugins.module_utils.consumer_cleanup import loaded_only
    assert fnmatch.fnmatchcase("batchq-a.timer", loaded_only("batchq-a.timer"))
    assert not fnmatch.fnmatchcase("batchq-ab.timer", loaded_only("batchq-a.timer"))
    assert not fnmatch.fnmatchcase("batchq-a.timers", loaded_only("batchq-a.timer"))
    assert fnmatch.fnmatchcase("batchq-a.2.start.timer", "batchq-a.*start.timer")
    assert not fnmatch.fnmatchcase("batchq-a-b.start.timer", "batchq-a.*start.timer")


def test_stale_secrets_are_those_no_unit_names_of_consumers_this_list_knows():
    consumers = normalize_consumers([
        {"name": "mail", "command": "/bin/true", "credentials": {"kept": "k"}, "secret_environment": {"A": "a"}},
        {"name": "sync", "command": "/bin/true"},
        {"name": "old", "state": "absent"},
    ])
    found = ["/etc/batchq/mail.env", "/etc/batchq/mail.kept.cred", "/etc/batchq/mail.kept.cred-encrypted",
             "/etc/batchq/mail.rotated.away.cred", "/etc/batchq/mail.token.hookcred", "/etc/batchq/sync.env",
             "/etc/batchq/old.x.cred", "/etc/batchq/gone.env", "/etc/batchq/gone.db.cred-encrypted",
             "/etc/batchq/others.env", "/etc/batchq/mail.conf"]
    # the host's systemd reads clear text (247-249): the encrypted form is stale, and the other way round
    assert stale_secrets(found, consumers, removed=["gone"]) == [
        "/etc/batchq/gone.db.cred-encrypted", "/etc/batchq/gone.env", "/etc/batchq/mail.kept.cred-encrypted",
        "/etc/batchq/mail.rotated.away.cred", "/etc/batchq/mail.token.hookcred", "/etc/batchq/old.x.cred",
        "/etc/batchq/sync.env"]
    assert "/etc/batchq/mail.kept.cred" in stale_secrets(found, consumers, encrypted=True)
    # what remove.yml deletes with a removed consumer's units: all of its secrets, and only those
    assert stale_secrets(found, [], removed=["gone"]) == ["/etc/batchq/gone.db.cred-encrypted", "/etc/batchq/gone.env"]


PATHS = D + "/paths.target.wants"


def test_the_path_unit_of_a_range_stays_with_the_range_and_goes_with_it():
    ranged = {"name": "a", "instances": {"min": 1, "max": 3}, "backlog_exit_code": 75}
    found = [D + "/batchq-a@.service", D + "/batchq-a@.timer", WANTS + "/batchq-a@1.timer", D + "/batchq-a.path",
             PATHS + "/batchq-a.path"]
    assert leftovers(found, consumers(ranged)) == {"stop": [], "drain": [], "remove": [], "removed": []}
    records = ["/run/batchq/scale/batchq-a.json", "/run/batchq/scale/batchq-a.json.lock"]
    # a fixed count again: the path unit is stopped and goes; the instances up to the count run on,
    # and those above it, which a backlog may have woken, end (no link names them)
    fixed = leftovers(found, consumers(dict(ranged, instances=2)))
    assert fixed["remove"] == sorted(found[3:] + records) and fixed["removed"] == []
    assert {"batchq-a.pat[h]", "batchq.scale@batchq-a.servic[e]", "batchq-a@3.time[r]",
            "batchq-a@64.time[r]"} <= set(fixed["stop"])
    assert not {"batchq-a@1.time[r]", "batchq-a@2.time[r]", "batchq-a@*.timer"} & set(fixed["stop"])
    assert "batchq-a@3.servic[e]" in fixed["drain"] and "batchq-a@2.servic[e]" not in fixed["drain"]
    # one instance: another shape, whose template's instances all end
    one = leftovers(found, consumers(dict(ranged, instances=1)))
    assert "batchq-a@*.timer" in one["stop"] and "batchq-a@*.service" in one["drain"]
    # the consumer goes: all of it
    gone = leftovers(found, consumers({"name": "a", "state": "absent"}))
    assert gone["remove"] == sorted(found + records) and "batchq-a@*.timer" in gone["stop"]
    assert {"batchq-a.pat[h]", "batchq.scale@batchq-a.servic[e]"} <= set(gone["stop"])
