"""Whether this node's Ray install has bytecode its processes can use.

Every process of a Ray cluster (each worker, so each replica, and Ray's agents and
monitors) imports Ray as it starts. Python keeps the compiled form of a module next to its
source (``__pycache__``), written on first import. Where it cannot be written
(``PYTHONDONTWRITEBYTECODE`` set, as many container images do, or an install this user
cannot write to) and the installer wrote none (uv without ``--compile-bytecode``; pip
writes it), each process compiles Ray from source again: measured on a 2-core host,
``import ray`` took 1.9 s of CPU instead of 0.8 s, and a replica's start 3.3 s instead
of 1.9 s.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from types import ModuleType

import ray

logger = logging.getLogger("app_toolkit.ray")


def compiled(module: ModuleType) -> bool:
    """Whether ``module``'s bytecode is where Python looks for it. Called after the module
    was imported here, which wrote that file if it could. The plain ``.pyc`` is looked for
    (Ray's workers run without ``-O``); True where it cannot be told (no source file, no
    cache for this interpreter)."""
    source = getattr(module, "__file__", None)
    if not source or not source.endswith(".py"):
        return True
    try:
        cached = importlib.util.cache_from_source(source, optimization="")
    except NotImplementedError:  # sys.implementation.cache_tag is None: no bytecode at all
        return True
    return os.path.exists(cached)


def warn_if_compiled_at_each_start(module: ModuleType = ray) -> None:
    """Log a warning, saying what to do, when ``module`` (Ray) is compiled from source by
    each process of the embedded cluster, which runs from this install (where Python may
    write the bytecode, the first worker does, and no warning is due)."""
    if compiled(module) or not _unwritable(module):
        return
    logger.warning(
        "%s's modules have no bytecode here (%s is missing), and Python cannot write it: every "
        "process of the cluster compiles them again as it starts, about a second of CPU each "
        "(docs/deploy.md). Install with bytecode (pip does; uv pip install --compile-bytecode, "
        "or UV_COMPILE_BYTECODE=1), or run `python -m compileall -q` on the install.",
        module.__name__,
        importlib.util.cache_from_source(str(module.__file__), optimization=""),
    )


def _unwritable(module: ModuleType) -> bool:
    """Whether Python may not write ``module``'s bytecode: told not to, or its folder is
    not this user's to write."""
    folder = os.path.dirname(str(module.__file__))
    return sys.dont_write_bytecode or not os.access(folder, os.W_OK)
