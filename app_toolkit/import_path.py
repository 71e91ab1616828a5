"""Import ``module:attribute`` strings, with errors that say how to fix them."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from app_toolkit.exceptions import ConfigError


def import_attr(path: str) -> Any:
    """Import ``"package.module:attribute"`` (the attribute may be dotted)."""
    module_name, sep, attribute = path.partition(":")
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
