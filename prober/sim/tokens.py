"""Token arithmetic: how many tokens a prompt costs and what the generated tokens say.

Prompt lengths are counted like a tokenizer would, not by whitespace: every run of word
characters and every punctuation mark is one token, and a chat request pays a fixed template
overhead (4 tokens per message plus 3 to prime the reply, the shape of OpenAI's documented
estimate). The prober calibrates words-per-token from `usage.prompt_tokens`, so the count must
be deterministic and differ from the word count. Output tokens are short words from a fixed
list, one word per token, so a client can count tokens from the text.
"""

from __future__ import annotations

import re

TOKENS_PER_MESSAGE = 4
TOKENS_PER_REPLY = 3

_PIECE = re.compile(r"\w+|[^\w\s]")
# Each word starts with a space and has no inner space: text.split() recovers the tokens.
WORDS = (" the", " tok", " model", " stream", " of", " a", " word", " and", " sim", " data")


def count_text_tokens(text: str) -> int:
    """Tokens in a plain text: word runs and punctuation marks."""
    return len(_PIECE.findall(text))


def _content_text(content: object) -> str:
    """Text of a chat message's content: a string, or a list of {type: text, text} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, dict):
                raise ValueError("message content parts must be objects")
            text = part.get("text", "")
            if not isinstance(text, str):
                raise ValueError("message content part 'text' must be a string")
            texts.append(text)
        return " ".join(texts)
    raise ValueError("message content must be a string or a list of parts")


def count_chat_tokens(messages: object) -> int:
    """Prompt tokens of a chat request: content tokens plus the chat-template overhead."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    total = TOKENS_PER_REPLY
    for message in messages:
        if not isinstance(message, dict):
            raise ValueError("each message must be an object")
        total += TOKENS_PER_MESSAGE + count_text_tokens(_content_text(message.get("content")))
    return total


def count_prompt_tokens(prompt: object) -> int:
    """Prompt tokens of a completions request: a string, strings, or token ids."""
    if isinstance(prompt, str):
        return count_text_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return sum(count_text_tokens(p) for p in prompt)
        # Token ids are already tokens; bool is excluded because JSON true is not an id.
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return len(prompt)
    raise ValueError("'prompt' must be a string, a list of strings or a list of token ids")


def output_text(start: int, count: int) -> str:
    """Text of output tokens start .. start+count-1."""
    return "".join(WORDS[i % len(WORDS)] for i in range(start, start + count))
