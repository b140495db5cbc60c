"""llm-prober: measure how OpenAI-compatible LLM endpoints feel to users, and when to scale them."""

__version__ = "0.1.0"
