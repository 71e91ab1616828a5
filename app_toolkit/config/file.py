"""Deploy config files: Ray Serve's YAML schema (``serve build`` / ``serve deploy``).

A file names the proxy options and the applications to run, each by import path, with
per-deployment options that override the ones in code::

    proxy_location: EveryNode
    http_options: {host: 127.0.0.1, port: 8000}
    applications:
    - name: chat
      route_prefix: /
      import_path: chat.app:app
      deployments:
      - name: ChatModel
        num_replicas: 2

Loading validates the whole file before anything is deployed; every error names the file,
the application and the field path. Ray Serve fields this toolkit does not implement are
accepted only at their neutral value (what ``serve build`` writes; the table is
``ray_serve_only.py``), so a file written for Ray Serve either means the same here or
fails naming the field and what to do instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from app_toolkit.config import (
    ApplicationOptions,
    AutoscalingPolicy,
    DeploymentConfig,
    HTTPOptions,
    LoggingConfig,
    ShadowOptions,
    default_of,
)
from app_toolkit.config.ray_serve_only import drop_ray_serve_only
from app_toolkit.config.schema import SECRET_VALUES, field_errors
from app_toolkit.exceptions import ConfigError
from app_toolkit.import_path import split_import_path

ProxyLocation = Literal["EveryNode", "HeadOnly", "Disabled"]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileHTTPOptions(HTTPOptions):
    """``http_options``: the proxy's options, less ``proxy_location`` (top level in a file)."""

    @model_validator(mode="before")
    @classmethod
    def _top_level_only(cls, data: object) -> object:
        if isinstance(data, dict) and "proxy_location" in data:
            raise ValueError("proxy_location belongs at the top level of the file, not in http_options")
        return data


class GRPCOptions(_Schema):
    """``grpc_options``: accepted as ``serve build`` writes it. Without servicer functions
    Ray Serve starts no gRPC server either, so the other fields mean nothing here."""

    port: int = 9000
    request_timeout_s: float | None = None
    enable_reflection: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _ray_serve_fields(cls, data: object) -> object:
        return drop_ray_serve_only("grpc", data)


class DeploymentOverride(_Schema):
    """One entry of an application's ``deployments``: options that replace the code's."""

    name: str
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        if "name" not in data:
            raise ValueError("each deployment needs its name (the class or function name, or name=...)")
        options = {key: value for key, value in data.items() if key != "name"}
        DeploymentConfig.model_validate(options)  # types, bounds and unknown fields, now
        actor = options.get("ray_actor_options")
        runtime_env = actor.get("runtime_env") if isinstance(actor, dict) else None
        problem = remote_code_problem(runtime_env) if isinstance(runtime_env, dict) else None
        if problem is not None:
            raise field_errors("deployment", {("ray_actor_options", "runtime_env"): (runtime_env, problem)})
        return {"name": data["name"], "options": options}


class ShadowConfig(ShadowOptions):
    """``shadow:`` of an application entry: where the copies go, and how (``ShadowOptions``)."""

    to: str = Field(description="The application of the file that gets the copies.")


class ApplicationConfig(_Schema):
    """One entry of ``applications``."""

    name: str = default_of(ApplicationOptions, "name")
    route_prefix: str | None = default_of(ApplicationOptions, "route_prefix")
    import_path: str
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    args: dict[str, Any] = Field(default_factory=dict)
    deployments: list[DeploymentOverride] = Field(default_factory=list)
    traffic: dict[str, float] = Field(
        default_factory=dict,
        description="Split this application's traffic between applications of the file by "
        "weight, e.g. {chat: 90, chat-v2: 10} (docs/traffic.md); empty: it takes it all.",
    )
    shadow: ShadowConfig | None = Field(
        None, description="Copy a share of this application's requests to another (docs/traffic.md)."
    )
    autoscaling_policy: AutoscalingPolicy | None = Field(
        None,
        description="An application-level autoscaling policy deciding the replicas of all "
        "its autoscaled deployments at once (docs/autoscaling.md); null: each deployment's own.",
    )
    logging_config: LoggingConfig | None = Field(
        None, description="The logging_config of its deployments that set none of their own."
    )

    @model_validator(mode="before")
    @classmethod
    def _ray_serve_fields(cls, data: object) -> object:
        return drop_ray_serve_only("application", data)

    @model_validator(mode="after")
    def _check(self) -> ApplicationConfig:
        ApplicationOptions(name=self.name, route_prefix=self.route_prefix)
        names = [d.name for d in self.deployments]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"deployment {twice[0]!r} is listed twice")
        return self

    @field_validator("import_path")
    @classmethod
    def _module_and_attribute(cls, value: str) -> str:
        split_import_path(value)
        return value

    @field_validator("runtime_env")
    @classmethod
    def _remote_code_only(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = remote_code_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class ServeConfigFile(_Schema):
    """A whole deploy config file."""

    proxy_location: ProxyLocation = "EveryNode"
    http_options: FileHTTPOptions = Field(default_factory=FileHTTPOptions)
    grpc_options: GRPCOptions = Field(default_factory=GRPCOptions)
    logging_config: LoggingConfig = Field(default_factory=LoggingConfig)
    target_capacity: float | None = Field(
        None,
        ge=0,
        le=100,
        description="Percent of every deployment's replicas to run (Ray Serve's meaning: "
        "num_replicas and the autoscaling bounds scaled, rounded half up, at least 1 "
        "unless 0); unset: all of them.",
    )
    applications: list[ApplicationConfig] = Field(min_length=1)
    _written: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _ray_serve_fields(cls, data: object) -> object:
        return drop_ray_serve_only("file", data)

    @model_validator(mode="after")
    def _check(self) -> ServeConfigFile:
        for what, values in (
            ("name", [a.name for a in self.applications]),
            ("route_prefix", [a.route_prefix for a in self.applications if a.route_prefix is not None]),
        ):
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                raise ValueError(f"two applications have the {what} {twice[0]!r}; each needs its own")
        names = {a.name for a in self.applications}
        for app in self.applications:
            for variant, weight in app.traffic.items():
                if variant not in names:
                    raise ValueError(
                        f"the traffic of {app.name!r} goes to {variant!r}, which is not an application "
                        "of this file; add it to applications"
                    )
                if weight < 0:
                    raise ValueError(
                        f"the traffic weight of {variant!r} in {app.name!r} must not be negative"
                    )
            if app.shadow is not None and app.shadow.to not in names:
                raise ValueError(
                    f"the shadow of {app.name!r} is {app.shadow.to!r}, which is not an application "
                    "of this file; add it to applications"
                )
        return self

    def as_written(self) -> dict[str, Any]:
        """The file's data as it was read (what ``app-toolkit config`` shows back)."""
        return self._written

    def http(self) -> HTTPOptions:
        """The proxy options this file asks for."""
        return HTTPOptions.model_validate(
            {
                **self.http_options.model_dump(),
                "access_log": self.http_options.access_log and self.logging_config.enable_access_log,
                "proxy_location": self.proxy_location,
            }
        )


def remote_code_problem(runtime_env: Mapping[str, Any]) -> str | None:
    """What is wrong with a file's ``runtime_env`` (an application's, or a deployment's
    ``ray_actor_options``): replicas start on any node, from the controller, so a path on
    this machine means nothing there. Ray Serve has the same rule."""
    modules = runtime_env.get("py_modules") or []
    paths = [*(modules if isinstance(modules, list) else [modules])]
    if "working_dir" in runtime_env:
        paths.append(runtime_env["working_dir"])
    for path in paths:
        if not isinstance(path, str) or "://" not in path:
            return (
                f"working_dir and py_modules must be URIs every node can fetch (s3://..., "
                f"https://.../x.zip, gcs://...) or local:// paths present on every node, got "
                f"{path!r}; or install the code on the cluster's nodes"
            )
    return None


def parse_config(data: object, source: str) -> ServeConfigFile:
    """Validate an already-loaded config (a mapping); ``source`` names it in errors."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: expected a mapping with an 'applications' list, got {type(data).__name__}"
        )
    try:
        config = ServeConfigFile.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(_explain(exc, data, source)) from None
    config._written = _without_secrets(dict(data))
    return config


#: What a file's secret ``http_options`` values (``schema.SECRET_VALUES``) become where
#: the controller stores the file as written (``app-toolkit config`` prints it): a file
#: keeps them only where it is read.
BLANKED = "<not kept>"


def _without_secrets(data: dict[str, object]) -> dict[str, object]:
    http = data.get("http_options")
    if not isinstance(http, Mapping) or not any(http.get(name) is not None for name in SECRET_VALUES):
        return data
    kept = {
        name: BLANKED if name in SECRET_VALUES and value is not None else value
        for name, value in http.items()
    }
    return {**data, "http_options": kept}


def load_config(path: str | Path) -> ServeConfigFile:
    """Read and validate a config file (``yaml.safe_load``: plain data, no Python tags)."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"Cannot read config file {str(file)!r}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None
    return parse_config(data, str(file))


def dump_config(config: Mapping[str, object]) -> str:
    """YAML text of a config (keys in the schema's order)."""
    return str(yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=False))


def _explain(error: ValidationError, data: object, source: str) -> str:
    lines = []
    for item in error.errors():
        where = _field_path(item["loc"], data)
        if item["type"] == "extra_forbidden":
            lines.append(
                f"{where}: unknown field (in neither Ray Serve's schema nor app_toolkit's): "
                "remove it or correct its spelling"
            )
            continue
        if item["type"] == "missing":
            lines.append(f"{where}: required")
            continue
        message = str(item["msg"]).removeprefix("Value error, ")
        lines.append(f"{where}: {message}")
    return f"Invalid config {source}:\n  " + "\n  ".join(lines)


def _field_path(location: tuple[int | str, ...], data: object) -> str:
    """``applications[0] (name 'chat').deployments[1] (Model).num_replicas``."""
    parts: list[str] = []
    node = data
    for part in location:
        if part == "options":  # DeploymentOverride's internal split
            continue
        if isinstance(part, int):
            parts[-1] += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                parts[-1] += f" ({node['name']})"
            continue
        parts.append(str(part))
        node = node.get(part) if isinstance(node, dict) else None
    return ".".join(parts) or "file"


__all__ = [
    "ApplicationConfig",
    "DeploymentOverride",
    "ServeConfigFile",
    "dump_config",
    "load_config",
    "parse_config",
]
