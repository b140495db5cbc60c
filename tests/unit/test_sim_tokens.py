"""Prompt token counting (tokenizer-like, not whitespace) and generated token text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prober.sim.tokens import (
    TOKENS_PER_MESSAGE,
    TOKENS_PER_REPLY,
    count_chat_tokens,
    count_prompt_tokens,
    count_text_tokens,
    output_text,
)


def test_punctuation_counts_apart_from_words() -> None:
    assert count_text_tokens("Hello, world! How are you?") == 8  # 5 words
    assert count_text_tokens("") == 0


def test_chat_template_overhead() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello, world!"}]},
    ]
    assert count_chat_tokens(messages) == 3 + 4 + 2 * TOKENS_PER_MESSAGE + TOKENS_PER_REPLY


def test_completion_prompts() -> None:
    assert count_prompt_tokens("a b.") == 3
    assert count_prompt_tokens(["a", "b c"]) == 3
    assert count_prompt_tokens([101, 2023, 102]) == 3


@pytest.mark.parametrize("bad", [None, [], [{"content": 3}], ["not a message"]])
def test_bad_messages(bad: object) -> None:
    with pytest.raises(ValueError, match="message"):
        count_chat_tokens(bad)


@pytest.mark.parametrize("bad", [None, 3, [], [True], ["a", 1]])
def test_bad_prompts(bad: object) -> None:
    with pytest.raises(ValueError, match="'prompt' must be"):
        count_prompt_tokens(bad)


@given(st.text(), st.text())
def test_count_is_additive_across_whitespace(a: str, b: str) -> None:
    assert count_text_tokens(a + " " + b) == count_text_tokens(a) + count_text_tokens(b)


@given(st.integers(0, 50), st.integers(0, 50))
def test_output_is_one_word_per_token(start: int, n: int) -> None:
    text = output_text(start, n)
    assert len(text.split()) == n
    assert output_text(0, start) + text == output_text(0, start + n)
