"""Settings, read once from the environment (variables prefixed ``CHAT_``) or a ``.env`` file."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: The slowest pace a reply of each backend is planned for, in tokens a second: SmolLM2-135M
#: decoding a full batch of 8 on one CPU core (73.6 tokens/s together, docs/benchmarks.md);
#: a busy OpenAI-compatible server (set graceful_shutdown_timeout_s for yours).
REPLY_TOKENS_PER_S = {"local": 8.0, "openai": 20.0}
#: What a stopping replica's grace period adds to its longest reply: the prompt's pass and
#: the relay's own steps.
GRACE_MARGIN_S = 5.0


class Settings(BaseSettings):
    """Which model answers, and the limits every part of the service keeps."""

    model_config = SettingsConfigDict(env_prefix="CHAT_", env_file=".env", extra="ignore", frozen=True)

    backend: Literal["local", "openai", "echo"] = Field(
        "local",
        description="local: SmolLM2-135M on this machine's CPU; openai: any OpenAI-compatible "
        "server (vLLM, llama.cpp, Ollama, OpenAI); echo: repeats the prompt (tests, load tests).",
    )
    upstream_url: str = Field(
        "http://127.0.0.1:8080/v1", description="Base URL of the OpenAI-compatible server."
    )
    upstream_api_key: SecretStr = Field(SecretStr("none"), description="API key for the upstream server.")
    upstream_model: str = Field("default", description="Model name to ask the upstream server for.")
    upstream_continues: bool = Field(
        False,
        description="The upstream continues a partial assistant message (vLLM's continue_final_message): "
        "a reply whose model replica was lost goes on there; otherwise it ends with a failed event.",
    )
    upstream_timeout_s: float = Field(
        30.0, gt=0, description="Connect and read timeout towards the upstream."
    )
    echo_tokens_per_s: float = Field(50.0, gt=0, le=100_000, description="Pace of the echo backend.")
    max_batch_size: int = Field(8, ge=1, le=64, description="Chats decoded together by the local model.")
    max_context_tokens: int = Field(2048, ge=64, description="Prompt plus reply, in tokens (local and echo).")
    default_max_tokens: int = Field(512, ge=1, description="Reply length when a request sets none.")
    max_reply_tokens: int = Field(
        1024,
        ge=1,
        le=32_768,
        description="The longest reply, in tokens: a request asking for more gets this many (finish "
        "reason length). Stopping replicas wait this long a reply out (shutdown_grace_s).",
    )
    default_temperature: float = Field(
        0.3,
        ge=0,
        le=2,
        description="Sampling temperature when a request sets none (small models ramble hot).",
    )
    repetition_penalty: float = Field(
        1.1, ge=1.0, le=2.0, description="Local model: how much less likely a seen token becomes (1: none)."
    )
    max_model_replicas: int = Field(2, ge=1, description="Most model replicas the autoscaler starts.")
    scaling: Literal["load", "requests"] = Field(
        "load",
        description="What the model pool scales on: load (each replica's own: replies expected to wait "
        "longer than scale_wait_s for a decode slot; scaling.py) or requests (max_batch_size ongoing "
        "requests per replica, the toolkit's built-in policy).",
    )
    scale_wait_s: float = Field(
        2.0,
        gt=0,
        description="scaling=load: the longest a reply should wait for a decode slot; replies expected "
        "to wait longer call for model replicas.",
    )
    model_autoscaling: dict[str, float] = Field(
        {},
        description="autoscaling_config fields of the model pool over its defaults (scaling.DEFAULTS), "
        'e.g. \'{"upscale_delay_s": 2, "look_back_period_s": 5}\'.',
    )
    max_replies: int = Field(
        256, ge=1, description="Replies of the page API each Replies replica generates at once."
    )
    reply_keep_s: float = Field(60.0, gt=0, description="How long a finished reply can still be resumed.")
    reply_orphan_s: float = Field(30.0, gt=0, description="A reply nobody reads for this long is stopped.")
    reply_store: Literal["memory", "redis"] = Field(
        "memory",
        description="Where the page's replies are kept: memory (in the replica generating them) or "
        "redis (readable through every replica, and after the one generating them died).",
    )
    redis_url: SecretStr = Field(
        SecretStr("redis://127.0.0.1:6379/0"),
        description="The Redis of reply_store=redis (redis://[:password@]host:port/db, rediss:// for TLS).",
    )
    reply_replicas: int = Field(1, ge=1, le=64, description="Replicas of the Replies deployment.")
    reply_continue_attempts: int = Field(
        2, ge=0, le=10, description="How often a reply whose model replica was lost goes on on another."
    )
    reply_writer_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A reply whose generator has not been heard from for this long is reported "
        "lost to its readers (a failed event) instead of waited for.",
    )
    session_secret: SecretStr = Field(
        SecretStr(""),
        description="Signs the page's sign-in cookies (32+ characters); empty: a random one per "
        "deploy, so a redeploy signs everyone out.",
    )
    session_ttl_s: float = Field(12 * 3600.0, gt=0, description="How long a page sign-in lasts.")
    secure_cookies: bool = Field(
        False, description="Send the sign-in cookie over HTTPS only (set it behind TLS)."
    )
    ingress_replicas: int = Field(1, ge=1, le=64, description="Replicas of the HTTP ingress.")
    graceful_shutdown_timeout_s: float | None = Field(
        None,
        ge=0,
        description="How long a stopping model replica, and an ingress replica relaying its replies, "
        "let the replies under way finish (a redeploy, a scale-down) before ending them with an error "
        "that tells the client to retry. None: long enough for the longest reply (max_reply_tokens) "
        "at the backend's pace (shutdown_grace_s).",
    )
    cors_origins: list[str] = Field(
        [],
        description="Web origins whose pages may call the API from the browser (CORS), e.g. "
        '\'["https://chat.example.com"]\'; none by default. "*" allows every origin.',
    )

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.default_max_tokens > self.max_reply_tokens:
            raise ValueError(
                f"CHAT_DEFAULT_MAX_TOKENS ({self.default_max_tokens}) is more than CHAT_MAX_REPLY_TOKENS "
                f"({self.max_reply_tokens}), the longest reply: lower the one or raise the other"
            )
        secret = self.session_secret.get_secret_value()
        if secret and len(secret) < 32:
            raise ValueError("CHAT_SESSION_SECRET must be at least 32 characters (or empty)")
        return self

    def reply_tokens(self, asked: int | None) -> int:
        """How long a reply may be: what the request asked for (else ``default_max_tokens``),
        at most ``max_reply_tokens``."""
        return min(asked or self.default_max_tokens, self.max_reply_tokens)

    @property
    def shutdown_grace_s(self) -> float:
        """The grace period of the model and ingress replicas: ``graceful_shutdown_timeout_s``,
        or the time the longest reply (``max_reply_tokens``) takes at the backend's slowest
        pace, plus a margin (1,024 tokens: echo at 50 a second, 25.5 s; local, 133 s; openai,
        56.2 s)."""
        if self.graceful_shutdown_timeout_s is not None:
            return self.graceful_shutdown_timeout_s
        pace = self.echo_tokens_per_s if self.backend == "echo" else REPLY_TOKENS_PER_S[self.backend]
        return round(self.max_reply_tokens / pace + GRACE_MARGIN_S, 1)

    @property
    def model_name(self) -> str:
        """The one model id this service answers to."""
        return {"local": "SmolLM2-135M-Instruct", "echo": "echo", "openai": self.upstream_model}[self.backend]
