import pytest

from hearthgate.policies.counts import count_down


def test_count_down_drops_a_key_at_zero() -> None:
    counts = {"chat": 3, "rag": 1}
    count_down(counts, "chat")
    count_down(counts, "rag")
    assert counts == {"chat": 2}
    count_down(counts, "chat", 2)
    assert counts == {}


def test_count_down_of_a_key_never_counted_is_an_error() -> None:
    with pytest.raises(KeyError):
        count_down({}, "chat")
