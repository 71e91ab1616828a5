"""The chat application: the model pool, the reply store and the HTTP routes, wired.

Run it with ``app-toolkit run {{ cookiecutter.package_name }}.app:app`` and open
http://127.0.0.1:8000/. The builder takes settings on the command line too (fields of
``Settings``; they win over the environment):
``app-toolkit run {{ cookiecutter.package_name }}.app:build_app backend=echo``.
"""

from __future__ import annotations

import secrets

import app_toolkit as tk
from app_toolkit.llm import install_error_handlers
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from . import openai_api, page, scaling
from .access import Access
from .model import ChatModel
from .replies import Replies
from .settings import Settings


def build_app(settings: Settings | None = None) -> tk.App:
    """The application for ``settings`` (default: read from the environment)."""
    settings = settings or Settings()
    model = ChatModel.options(
        # On its replicas' own load (or requests per replica), between 1 and max_model_replicas.
        autoscaling_config=scaling.autoscaling_config(settings),
        # The local model: one reply per decode slot, so that none waits inside a busy
        # replica; the rest wait in the callers' queues, where a replica that frees a slot
        # or starts takes them. The others have no slots: their replies stream at once.
        max_ongoing_requests=settings.max_batch_size if settings.backend == "local" else 32,
        # The local model computes on the CPU it reserves; the others only wait on I/O.
        ray_actor_options={"num_cpus": 1 if settings.backend == "local" else 0},
        # A replica that stops (a redeploy, a scale-down) finishes the replies under way.
        graceful_shutdown_timeout_s=settings.shutdown_grace_s,
    ).bind(settings)
    replies = Replies.options(num_replicas=settings.reply_replicas).bind(model, settings)
    api = FastAPI(title="Chat", summary=f"OpenAI-compatible chat with {settings.model_name}")
    install_error_handlers(api)
    if settings.cors_origins:  # browser front ends on other origins calling the API directly
        api.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["*"],  # OpenAI's browser clients send headers of their own (x-stainless-*)
            expose_headers=["x-request-id"],
            max_age=600,
        )
    access = Access(_session_secret(settings), settings.session_ttl_s)
    api.include_router(openai_api.build_router(settings, model))
    api.include_router(page.build_router(settings, replies, model, access))
    # The ingress relays the model's replies: it lets them finish as long as the model does.
    return tk.App(
        api,
        name="chat",
        num_replicas=settings.ingress_replicas,
        graceful_shutdown_timeout_s=settings.shutdown_grace_s,
    )


def _session_secret(settings: Settings) -> bytes:
    """What signs the page's sign-in cookies: the configured secret, else a random one made
    here, once per deploy, and shipped to every ingress replica with the app."""
    configured = settings.session_secret.get_secret_value()
    if configured:
        return configured.encode()
    return secrets.token_bytes(32)


app = build_app()
