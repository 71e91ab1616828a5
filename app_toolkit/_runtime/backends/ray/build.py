"""Building applications on the cluster, each in a Ray task that runs under the
application's ``runtime_env``: the import is proven where replicas will run, and the
command that deploys needs none of the application's dependencies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError, RayTaskError

from app_toolkit._runtime.backends.ray.codec import dumps
from app_toolkit._runtime.messages import AppSpec
from app_toolkit._runtime.session import Build
from app_toolkit.exceptions import ConfigError

#: Setting up a runtime_env may install packages; a build that takes longer has failed.
BUILD_TIMEOUT_S = 600.0


def _build(build: Build) -> AppSpec:
    return build.make(dumps)


def build_on_cluster(builds: Sequence[Build]) -> list[AppSpec]:
    """Build every application (in parallel); any failure fails them all, naming each."""
    # A fresh worker per build (max_calls=1): it imports the code as it is now, not a
    # module a pooled worker imported for an earlier build.
    task = ray.remote(num_cpus=0, max_retries=0, max_calls=1)(_build)
    refs: list[Any] = [task.options(runtime_env=build.runtime_env or None).remote(build) for build in builds]
    specs: list[AppSpec] = []
    failures: list[str] = []
    for index, (build, ref) in enumerate(zip(builds, refs, strict=True)):
        where = f"applications[{index}] ({build.name})"
        try:
            specs.append(ray.get(ref, timeout=BUILD_TIMEOUT_S))
        except RayTaskError as exc:
            cause = exc.cause if exc.cause is not None else exc
            failures.append(f"{where}: {cause}")
        except GetTimeoutError:
            ray.cancel(ref, force=True)
            failures.append(f"{where}: not built within {BUILD_TIMEOUT_S:.0f} s")
        except RayError as exc:  # e.g. the runtime_env could not be set up
            failures.append(f"{where}: {exc}")
    if failures:
        hint = (
            "(the cluster's workers import the code: install it on every node, start "
            "`ray start` with it on PYTHONPATH, or ship it with the app's runtime_env working_dir)"
        )
        raise ConfigError("\n  ".join(["could not build:", *failures, hint]))
    return specs
