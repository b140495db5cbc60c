"""prober.prompts: cache-busting and convergence of the prompt length to the requested tokens."""

from __future__ import annotations

import random

import pytest

from prober.prompts import PromptBuilder

BUST_WORDS = 6


def test_cache_busted_prompts_differ_in_their_first_words() -> None:
    builder = PromptBuilder(seed=1)
    prompts = [builder.build(256)[0] for _ in range(20)]
    prefixes = {" ".join(p.split()[:BUST_WORDS]) for p in prompts}
    assert len(prefixes) == len(prompts)
    # Only the prefix differs: the rest of the prompt is the same body.
    tails = {" ".join(p.split()[BUST_WORDS:]) for p in prompts}
    assert len(tails) == 1


def test_without_cache_busting_prompts_are_identical() -> None:
    a, b = PromptBuilder(cache_bust=False), PromptBuilder(cache_bust=False)
    first = a.build(256)
    assert a.build(256) == first
    assert b.build(256) == first


def test_fixed_seed_repeats_the_sequence() -> None:
    a, b = PromptBuilder(seed=42), PromptBuilder(seed=42)
    assert [a.build(64) for _ in range(3)] == [b.build(64) for _ in range(3)]


def test_build_reports_its_word_count() -> None:
    for tokens in (16, 64, 1000):
        text, words = PromptBuilder(seed=0).build(tokens)
        assert words == len(text.split())


@pytest.mark.parametrize("tokens", [1, 8, 12])
def test_tiny_prompts_are_still_cache_busted(tokens: int) -> None:
    builder = PromptBuilder(seed=3)
    assert builder.build(tokens)[0] != builder.build(tokens)[0]


def server_prompt_tokens(words: int, rng: random.Random) -> int:
    """A server whose chat template adds 20 tokens and whose tokenizer gives 1.3 per word."""
    return round(20 + 1.3 * words + rng.uniform(-1.0, 1.0))


@pytest.mark.parametrize("cache_bust", [True, False])
@pytest.mark.parametrize("requested", [64, 256, 1024])
def test_observe_converges_within_five_percent(requested: int, cache_bust: bool) -> None:
    rng = random.Random(requested)
    builder = PromptBuilder(cache_bust=cache_bust, seed=7)
    for _ in range(4):
        _, words = builder.build(requested)
        builder.observe(words, server_prompt_tokens(words, rng))
    _, words = builder.build(requested)
    landed = 20 + 1.3 * words
    assert abs(landed - requested) <= 0.05 * requested, (landed, builder.tokens_per_word)


def test_observe_ignores_nonsense() -> None:
    builder = PromptBuilder()
    before = builder.tokens_per_word
    builder.observe(0, 100)
    builder.observe(100, 0)
    builder.observe(-1, -1)
    assert builder.tokens_per_word == before
