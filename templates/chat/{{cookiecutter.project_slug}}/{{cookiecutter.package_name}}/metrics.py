"""The chat's own metrics, in the same ``/-/metrics`` scrape as the toolkit's.

Label sets are bounded: ``owner`` is one of the names of the toolkit's API keys (or
``anonymous`` with keys off), the others take the few values listed in each help text.
"""

from __future__ import annotations

from app_toolkit.metrics import SIZE_BUCKETS, Counter, Histogram

_RATE_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)

TIME_TO_FIRST_TOKEN = Histogram(
    "chat_time_to_first_token_seconds", "From a reply's request reaching its model replica to its first text."
)
INTER_TOKEN_LATENCY = Histogram(
    "chat_inter_token_latency_seconds", "Between one text piece of a reply and the next."
)
TOKENS_PER_SECOND = Histogram(
    "chat_reply_tokens_per_second",
    "Completion tokens per second of each reply, after its first.",
    (),
    _RATE_BUCKETS,
)
TOKENS = Counter(
    "chat_tokens_total", "Tokens used, by key owner and kind (prompt, completion).", ("owner", "kind")
)
REPLIES = Counter(
    "chat_replies_total", "Replies by how they ended (finished, stopped, failed).", ("outcome",)
)
CANCELLATIONS = Counter(
    "chat_cancellations_total",
    "Replies stopped or abandoned before their end, by where they were (queued, prefill, decode).",
    ("stage",),
)
QUEUE_WAIT = Histogram(
    "chat_queue_wait_seconds", "Local model: time a reply waited for a place in the batch."
)
BATCH_OCCUPANCY = Histogram(
    "chat_batch_occupancy", "Local model: replies decoded together, per decoding step.", (), SIZE_BUCKETS
)
RESUMED = Counter(
    "chat_replies_resumed_total",
    "Replies continued elsewhere after losing their model replica (model) or their writer (writer).",
    ("lost",),
)
