"""Synthetic prompts of a requested length in tokens, cache-busted and calibrated.

The server's `usage.prompt_tokens` is the truth about length. A `PromptBuilder` keeps a
tokens-per-word ratio, learned from what the server reports, and sizes the next prompt to
land on the requested token count; the chat template's fixed overhead is absorbed by the
ratio and the estimate converges within a few requests.

Cache-busting (default): every prompt starts with random words, so no prefix cache can serve
it. With cache-busting off the prompt for a given length is identical every time (the bench
experiment that proves caching matters).

Calibration is bounded, because the count comes from the server: a report whose ratio lies
outside [0.25, 8] tokens per word (a server that always says 1, or 10**15) is ignored and
counted in `rejected`, and the ratio itself stays in that range, so a prompt never exceeds
four words per requested token (plus the instruction) whatever the server reports.

A question (`build_question`, a target's `question:`) is sent as written, after one line of
salt: `SALT_LEAD` and random words, then a blank line. The salt line changes every request
(cache-busting), the question never does, so an answer check judges the same question each
time; with cache-busting off the question goes alone. Its length is the question's own.

Shared prefixes (`build_shared`, for replayed traces): the prompt starts with one block of
text per hash id, so requests whose leading ids agree share their leading text and an
engine's prefix cache sees the sharing the trace describes. A block is `block_tokens` words
of the vocabulary (one token each in the usual vocabularies), the same for an id every time:
it is not resized by the calibration, which would change its text from one request to the
next. The prompt as a whole is still sized by the calibration: the blocks are cut, or
followed by words of the request's own, to reach the requested length, and the instruction
ends it. Cache-busting salts every block with a value drawn once per builder, so a new run
never hits what an earlier one left in the cache; without it the blocks are the same in
every run.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

# Common English words, each one token in the usual BPE / SentencePiece vocabularies, so the
# tokens-per-word ratio stays nearly constant whatever words are drawn.
_VOCABULARY = tuple(
    (
        "time year people way day man thing woman life child world school state family student "
        "group country problem hand part place case week company system program question work "
        "government number night point home water room mother area money story fact month lot "
        "right study book eye job word business issue side kind head house service friend father "
        "power hour game line end member law car city community name president team minute idea "
        "kid body information back parent face others level office door health person art war "
        "history party result change morning reason research girl guy moment air teacher force "
        "education foot boy age policy music market sense nation plan college interest death "
        "experience effect class control care field development role effort rate heart drug show "
        "leader light voice wife police mind price report decision son view relationship town "
        "road arm difference value building action model season society tax director position "
        "player record paper space ground form event official matter center couple site project "
        "activity star table need court oil situation cost industry figure street image phone "
        "data picture practice piece land product doctor wall patient worker news test movie "
        "north love support technology step baby computer type attention film tree source "
        "organization hair window evidence population river garden island bridge mountain summer "
        "winter letter animal bird horse ship train chair glass stone plant color sound "
    ).split()
)
_INSTRUCTION = "Write a long, detailed story that uses these words:"
_BUST_WORDS = 6
SALT_LEAD = "Ignore this line:"  # a question's salt line: this, then random words
_INITIAL_TOKENS_PER_WORD = 1.3
_SMOOTHING = 0.8
# Plausible tokens per word for these words, chat template overhead included. An English
# word is rarely under a third of a token or over a few; 8 leaves room for a template's
# overhead on a prompt of a dozen words.
MIN_TOKENS_PER_WORD = 0.25
MAX_TOKENS_PER_WORD = 8.0


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """The blocks a prompt starts with: one per id, each `block_tokens` words."""

    hash_ids: tuple[int, ...]
    block_tokens: int


@functools.lru_cache(maxsize=512)  # ~2 MB at 512-word blocks; popular prefixes stay built
def _block(seed: int, words: int) -> tuple[str, ...]:
    return tuple(random.Random(seed).choices(_VOCABULARY, k=words))


class PromptBuilder:
    """Build prompts for one target; `observe()` feeds back the server's prompt token count."""

    def __init__(self, *, cache_bust: bool = True, seed: int | None = None) -> None:
        self._cache_bust = cache_bust
        self._rng = random.Random(seed)
        self._tokens_per_word = _INITIAL_TOKENS_PER_WORD
        self.rejected = 0  # reports ignored as implausible
        # Its own generator: the seeded sequence of busting words stays what it was.
        self._salt = random.Random(seed).getrandbits(64) if cache_bust else 0

    @property
    def tokens_per_word(self) -> float:
        return self._tokens_per_word

    def words_for(self, tokens: int) -> int:
        most = max(1, round(tokens / MIN_TOKENS_PER_WORD))
        return min(most, max(1, round(tokens / self._tokens_per_word)))

    def build(self, tokens: int) -> tuple[str, int]:
        """A prompt of about `tokens` tokens, and its word count (to pass to `observe`)."""
        n_words = self.words_for(tokens)
        body_words = max(0, n_words - len(_INSTRUCTION.split()))
        if self._cache_bust:
            # Even a prompt shorter than the instruction gets two random words: a prompt that
            # a prefix cache can serve would measure the cache, not the engine.
            bust = self._rng.choices(_VOCABULARY, k=max(2, min(_BUST_WORDS, body_words)))
            body_words = max(0, body_words - len(bust))
        else:
            bust = []
        # The body is fixed for a given length: only the random prefix differs between requests.
        body = [_VOCABULARY[(i * 7919) % len(_VOCABULARY)] for i in range(body_words)]
        text = " ".join([*bust, _INSTRUCTION, *body]) if bust else " ".join([_INSTRUCTION, *body])
        return text, len(text.split())

    def build_question(self, question: str) -> str:
        """`question` as written, after a line of salt (and a blank line) when busting."""
        if not self._cache_bust:
            return question
        salt = " ".join(self._rng.choices(_VOCABULARY, k=_BUST_WORDS))
        return f"{SALT_LEAD} {salt}\n\n{question}"

    def build_shared(self, tokens: int, prefix: SharedPrefix) -> tuple[str, int]:
        """A prompt of about `tokens` tokens that starts with `prefix`'s blocks."""
        n_words = self.words_for(tokens)
        instruction = _INSTRUCTION.split()
        room = max(0, n_words - len(instruction))
        words: list[str] = []
        for hash_id in prefix.hash_ids:
            if len(words) >= room:
                break
            words.extend(_block(self._salt << 128 | hash_id, prefix.block_tokens))
        del words[room:]
        if len(words) < room:  # beyond the listed blocks: this request's own words
            own = room - len(words)
            if self._cache_bust:
                words.extend(self._rng.choices(_VOCABULARY, k=own))
            else:
                words.extend(_VOCABULARY[(i * 7919) % len(_VOCABULARY)] for i in range(own))
        text = " ".join([*words, *instruction])
        return text, len(words) + len(instruction)

    def observe(self, words: int, prompt_tokens: int) -> bool:
        """Learn from the server's `usage.prompt_tokens` for a prompt of `words` words.

        False (and `rejected` counts it) when the ratio is implausible: it is not learned.
        """
        if words <= 0 or prompt_tokens <= 0:
            return False
        ratio = prompt_tokens / words
        if not MIN_TOKENS_PER_WORD <= ratio <= MAX_TOKENS_PER_WORD:
            self.rejected += 1
            return False
        self._tokens_per_word += _SMOOTHING * (ratio - self._tokens_per_word)
        return True
