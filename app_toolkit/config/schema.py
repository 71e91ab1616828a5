"""What every option schema shares: strict models, the in-place marker, readable errors."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from app_toolkit.exceptions import ConfigError

#: Environment variable with the toolkit's log level (``app-toolkit run --log-level``),
#: read by the toolkit's Ray workers when they start.
LOG_LEVEL_ENV = "APP_TOOLKIT_LOG_LEVEL"

#: Application, deployment and pool names (they appear in URLs, actor names and logs).
NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")


#: Marks an option that running replicas take in place (a change never restarts them);
#: every other deployment option is part of the code version.
IN_PLACE: dict[str, JsonValue] = {"applies_in_place": True}


class Strict(BaseModel):
    """A schema: unknown options are errors, values are frozen and defaults checked."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


M = TypeVar("M", bound=BaseModel)


#: Options whose values are secrets: never repeated, and blanked where a config file is
#: kept (``config/file.py``).
SECRET_VALUES = frozenset({"dashboard_token", "ssl_keyfile_password"})
#: Options whose values an error message never repeats: secrets, and what may hold one by
#: mistake (a key pasted where its hash goes; vLLM's plaintext ``api_key``).
SECRET_OPTIONS = SECRET_VALUES | {"api_keys", "hash", "api_key"}


def explain(error: ValidationError, where: str) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "value"
        if item["type"] == "extra_forbidden":
            lines.append(f"unknown option {field!r}")
            continue
        message = item["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        value = item.get("input")
        if SECRET_OPTIONS.intersection(item["loc"]) or (
            isinstance(value, Mapping) and SECRET_OPTIONS.intersection(value)
        ):
            lines.append(f"{field} {message}")  # the value may hold a secret
        else:
            lines.append(f"{field} {message}, got {value!r}")
    return f"Invalid {where}: " + "; ".join(lines)


def field_errors(title: str, problems: Mapping[str | tuple[str, ...], tuple[object, str]]) -> ValidationError:
    """A ``ValidationError`` located at each field of ``problems`` (a name or a path of
    names -> (value, message)), for a check that runs before the fields are validated:
    raised from a validator, its locations nest under the caller's."""
    return ValidationError.from_exception_data(
        title,
        [
            # The message goes in as context: a template would read its braces as fields.
            InitErrorDetails(
                type=PydanticCustomError("field", "{message}", {"message": message}),
                loc=(field,) if isinstance(field, str) else field,
                input=value,
            )
            for field, (value, message) in problems.items()
        ],
    )


def default_of(model: type[BaseModel], name: str) -> Any:
    """The default of one option, for signatures that repeat a model's options."""
    return model.model_fields[name].get_default(call_default_factory=True)


def parse_options(model: type[M], options: Mapping[str, object], where: str) -> M:
    """Validate ``options`` against ``model``, raising ConfigError with a readable message."""
    try:
        return model.model_validate(dict(options))
    except ValidationError as exc:
        raise ConfigError(explain(exc, where)) from None


def json_values(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` if it holds JSON values only (kwargs that travel to other processes and into
    config files); ValueError naming the one that does not."""
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"must hold JSON values only (strings, numbers, lists, dicts): {exc}") from None
    return value
