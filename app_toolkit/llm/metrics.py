"""Per-model series of LLM serving, recorded in the model's replicas and scraped at
``/-/metrics`` (docs/llm.md, "Metrics")."""

from __future__ import annotations

from app_toolkit.metrics import Counter, Histogram

#: Finer than request durations: a token takes milliseconds.
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.0, 10.0)

TIME_TO_FIRST_TOKEN = Histogram(
    "llm_time_to_first_token_seconds",
    "From the ingress taking a request to the model's first output token",
    ("model",),
)
FRAMEWORK_TIME = Histogram(
    "llm_framework_seconds",
    "The framework's share of time to first token: from the ingress taking a request to the engine seeing it",
    ("model",),
    buckets=TOKEN_BUCKETS,
)
QUEUE_TIME = Histogram(
    "llm_queue_seconds",
    "Time a reply waited in the model's replica for an engine slot",
    ("model",),
)
TIME_PER_OUTPUT_TOKEN = Histogram(
    "llm_time_per_output_token_seconds",
    "Time between two output tokens of one reply",
    ("model",),
    buckets=TOKEN_BUCKETS,
)
PREFIX_CACHE_QUERIES = Counter(
    "llm_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache", ("model",)
)
PREFIX_CACHE_HITS = Counter(
    "llm_prefix_cache_hits_total", "Prompt tokens found in the prefix cache (not read again)", ("model",)
)
PROMPT_TOKENS = Counter("llm_prompt_tokens_total", "Tokens read from prompts", ("model",))
GENERATION_TOKENS = Counter("llm_generation_tokens_total", "Tokens generated", ("model",))
REPLIES = Counter("llm_replies_total", "Replies by how they ended", ("model", "finish_reason"))
