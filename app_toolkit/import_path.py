"""Import ``module:attribute`` strings, with errors that say how to fix them.

Ray Serve's import paths for what this package implements itself (Ray Serve LLM's
builders) name ours instead, so a config file written for Ray Serve runs unchanged; any
other path into ``ray.serve`` is refused, since the toolkit never imports Ray Serve.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from app_toolkit.exceptions import ConfigError

#: Ray Serve's import paths and the paths of their counterparts here.
RAY_SERVE_COUNTERPARTS = {
    "ray.serve.llm:build_openai_app": "app_toolkit.llm:build_openai_app",
    "ray.serve.llm:build_llm_deployment": "app_toolkit.llm:build_llm_deployment",
}


def ray_serve_counterpart(path: str) -> str:
    """``path``, or the path of its counterpart here when it names Ray Serve's; a ConfigError
    for any other path into ``ray.serve``."""
    if path in RAY_SERVE_COUNTERPARTS:
        return RAY_SERVE_COUNTERPARTS[path]
    module = path.partition(":")[0]
    if module == "ray.serve" or module.startswith("ray.serve."):
        known = ", ".join(sorted(RAY_SERVE_COUNTERPARTS))
        raise ConfigError(
            f'"{path}" is in Ray Serve, which app_toolkit replaces and never imports; point at '
            f"your own application or builder (of Ray Serve's, app_toolkit runs {known})"
        )
    return path


def import_attr(path: str) -> Any:
    """Import ``"package.module:attribute"`` (the attribute may be dotted; a Ray Serve
    path: its counterpart here)."""
    module_name, sep, attribute = ray_serve_counterpart(path).partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f'Import string "{path}" must look like "module:attribute", e.g. "demo:app"')
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
            ) from None
    return value
