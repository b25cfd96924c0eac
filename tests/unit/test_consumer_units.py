"""consumer_units' listing of folders, as ansible.builtin.find lists them for the role."""

from ansible_collections.batchq.consumers.plugins.modules import consumer_units


def test_find_lists_matching_names_to_the_depth_asked_without_following_links(tmp_path):
    units = tmp_path / "system"
    (units / "timers.target.wants").mkdir(parents=True)
    (units / "batchq-a.service.d").mkdir()
    (units / "batchq-a.service.d" / "override.conf").write_text("")
    (units / "batchq-a.service").write_text("")
    (units / "sshd.service").write_text("")
    (units / "timers.target.wants" / "batchq-a.timer").symlink_to(units / "batchq-a.service")
    (units / "timers.target.wants" / "deeper").mkdir()
    (units / "timers.target.wants" / "deeper" / "batchq-b.timer").write_text("")
    found = consumer_units.find(str(units), ["batchq-*"], 2)
    assert found == [str(units / "batchq-a.service"), str(units / "batchq-a.service.d"),
                     str(units / "timers.target.wants" / "batchq-a.timer")]
    shallow = [str(units / "batchq-a.service"), str(units / "batchq-a.service.d")]
    assert consumer_units.find(str(units), ["batchq-*"], 1) == shallow
    assert consumer_units.find(str(tmp_path / "none"), ["*"], 1) == []
