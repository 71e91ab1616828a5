"""The application: routes plus the deployment they call.

Serve it with ``app-toolkit run {{ cookiecutter.package_name }}.app:app``. The builder takes
settings on the command line too (fields of ``Settings``; they win over the environment):
``app-toolkit run {{ cookiecutter.package_name }}.app:build_app greeting=Hi``.
"""

from __future__ import annotations

import app_toolkit as tk

from .greeter import Greeter
from .routes import build_router
from .settings import Settings


def build_app(settings: Settings | None = None) -> tk.App:
    """The application for ``settings`` (default: read from the environment)."""
    settings = settings or Settings()
    greeter = Greeter.bind(settings.greeting)
    return tk.App(build_router(greeter), name="{{ cookiecutter.project_slug }}", num_replicas=settings.replicas)


app = build_app()
