"""Import strings, read as Ray Serve reads them, with errors that say how to fix them.

An import path is ``"module:attribute"`` (the attribute may be dotted) or
``"module.attribute"`` (split at the last dot), as Ray's ``import_attr`` takes both:
:func:`split_import_path` is the one reader of that rule, and every option that takes an
import path (an application's, a router's, a policy's, a shadow's compare, the tracing
set-up) is checked and imported through it.

Ray Serve's import paths for what this package implements itself (Ray Serve LLM's
builders) name ours instead, so a config file written for Ray Serve runs unchanged; any
other path into ``ray.serve`` is refused, since the toolkit never imports Ray Serve.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

from app_toolkit.exceptions import ConfigError

#: How an import path may be written, for the messages that say how to fix one.
IMPORT_PATH_FORMS = '"module:attribute" or "module.attribute", e.g. "demo:app" or "demo.app"'

#: Ray Serve's import paths (written "module:attribute") and the paths of their
#: counterparts here.
RAY_SERVE_COUNTERPARTS = {
    "ray.serve.llm:build_openai_app": "app_toolkit.llm:build_openai_app",
    "ray.serve.llm:build_llm_deployment": "app_toolkit.llm:build_llm_deployment",
    # Ray Serve LLM's default ingress_cls, as its configs name it.
    "ray.serve.llm.ingress:OpenAiIngress": "app_toolkit.llm:OpenAIIngress",
    "ray.llm._internal.serve.core.ingress.ingress:OpenAiIngress": "app_toolkit.llm:OpenAIIngress",
}


def split_import_path(path: str) -> tuple[str, str]:
    """``path``'s module and attribute: split at its colon (the attribute may be dotted),
    or else at its last dot, as Ray's ``import_attr`` splits it. A ConfigError saying how
    to write one when it is neither."""
    module, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    if not all(name.isidentifier() for name in [*module.split("."), *attribute.split(".")]):
        raise ConfigError(f'Import string "{path}" must look like {IMPORT_PATH_FORMS}')
    return module, attribute


def colon_form(path: str) -> str:
    """``path`` written ``"module:attribute"`` (either form given): how the tables of
    Ray Serve's names are keyed."""
    module, attribute = split_import_path(path)
    return f"{module}:{attribute}"


def ray_serve_counterpart(path: str) -> str:
    """``path``, or the path of its counterpart here when it names Ray Serve's; a ConfigError
    for any other path into ``ray.serve``."""
    module, attribute = split_import_path(path)
    counterpart = RAY_SERVE_COUNTERPARTS.get(f"{module}:{attribute}")
    if counterpart is not None:
        return counterpart
    if module == "ray.serve" or module.startswith("ray.serve."):
        known = ", ".join(sorted(RAY_SERVE_COUNTERPARTS))
        raise ConfigError(
            f'"{path}" is in Ray Serve, which app_toolkit replaces and never imports; point at '
            f"your own application or builder (of Ray Serve's, app_toolkit runs {known})"
        )
    return path


def import_attr(path: str) -> Any:
    """Import ``"package.module:attribute"`` or ``"package.module.attribute"`` (a Ray
    Serve path: its counterpart here)."""
    module_name, attribute = split_import_path(ray_serve_counterpart(path))
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(
                f'Could not import module "{module_name}" from "{path}"; run from the folder '
                f"that contains it or install it (the current folder is {cwd})"
            ) from None
        raise
    value: Any = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ConfigError(
                f'Module "{module_name}" has no attribute "{attribute}" (from "{path}")'
                + _module_hint(module_name, attribute)
            ) from None
    return value


def _module_hint(module_name: str, attribute: str) -> str:
    """When ``module.attribute`` is a module not imported (``"examples.demo"`` naming a
    module, not what is in it): how to name an attribute of it."""
    submodule = f"{module_name}.{attribute}"
    try:
        found = importlib.util.find_spec(submodule) is not None
    except (ImportError, ValueError):
        found = False
    return f'; "{submodule}" is a module: name what in it to import, e.g. "{submodule}:app"' if found else ""
