"""The tests' one wait (waiting.py), on a clock of the test's own: no real time passes."""

import pytest

import waiting


class Clock:
    """time.monotonic and time.sleep of a clock that moves only when slept on."""

    def __init__(self):
        self.now, self.slept = 100.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(waiting.time, "monotonic", fake.monotonic)
    monkeypatch.setattr(waiting.time, "sleep", fake.sleep)
    return fake


def test_returns_the_first_truthy_value_polled_every_interval(clock):
    values = iter([None, 0, [], "", ["found"], ["later"]])
    assert waiting.wait_for(lambda: next(values), 10, "a value", interval=0.25) == ["found"]
    assert clock.slept == [0.25] * 4


def test_a_timeout_names_what_was_awaited_and_the_last_value_seen(clock):
    values = iter([None, 0, [], {}, "never reached"])
    with pytest.raises(AssertionError) as failure:
        waiting.wait_for(lambda: next(values), 1.5, "the queue to drain", interval=0.5)
    # polled at 0, 0.5 and 1 s, and at the deadline
    assert str(failure.value) == "waited 1.5s in vain for the queue to drain; last seen: {}"
    assert clock.slept == [0.5, 0.5, 0.5]


def test_the_last_sleep_ends_at_the_deadline(clock):
    with pytest.raises(AssertionError):
        waiting.wait_for(lambda: False, 1, "nothing", interval=0.75)
    assert clock.slept == [0.75, 0.25]


def test_explain_adds_its_text_to_the_failure(clock):
    with pytest.raises(AssertionError, match=r"in vain for x; last seen: None\n--- journal ---$"):
        waiting.wait_for(lambda: None, 1, "x", explain=lambda: "\n--- journal ---")


class Empty:
    """A falsy value with a long text, as a record of what is not there yet."""

    def __bool__(self):
        return False

    def __repr__(self):
        return "e" * 5000


def test_a_long_last_value_is_cut(clock):
    with pytest.raises(AssertionError) as failure:
        waiting.wait_for(Empty, 0, "y")
    assert str(failure.value) == "waited 0s in vain for y; last seen: %s... (5000 characters)" % (
        "e" * waiting.SHOWN_CHARS)


def test_a_condition_that_raises_ends_the_wait_at_once(clock):
    def condition():
        raise AssertionError("the process ended")

    with pytest.raises(AssertionError, match="the process ended"):
        waiting.wait_for(condition, 30, "the batch to start")
    assert clock.slept == []
