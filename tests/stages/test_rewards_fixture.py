"""A reward for RL machinery tests: random tiny-model outputs vary on it, so every group has something to learn."""

from tests.stages import even_length


def test_even_length_reward():
    assert even_length("ab", "x") == 1.0 and even_length("abc", "x") == 0.0
