"""Application builders: what an import path names, as an application, and the one rule by
which a builder function gets its arguments, whether they come from a config file's
``args`` or from ``app-toolkit run``'s ``KEY=VALUE`` pairs (Ray Serve's rule):

- only a builder (a function taking one argument and returning an application) takes
  arguments; anything else named with arguments is an error;
- a builder whose parameter is annotated with a pydantic model (``X | None`` included)
  gets the arguments validated into that model; an unknown key is an error even where the
  model ignores extras, and a pydantic-settings model still reads the environment, the
  arguments winning over it;
- any other builder gets the arguments as a ``dict`` (of ``str`` from the command line).
"""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from collections.abc import Callable, Mapping

from pydantic import AliasChoices, AliasPath, BaseModel, ValidationError

from app_toolkit.config.schema import SECRET_OPTIONS
from app_toolkit.deployment import Application, Deployment
from app_toolkit.exceptions import BuilderArgsError, ConfigError
from app_toolkit.import_path import import_attr


def load_application(path: str, args: Mapping[str, object], name: str | None) -> Application:
    """Import ``path``; a builder function is called with ``args``; anything else must
    come without them."""
    value = import_attr(path)
    if inspect.isfunction(value):
        return as_application(call_builder(value, path, args), path, name)
    if args:
        raise BuilderArgsError(
            f'"{path}" is not a builder function (it is a {type(value).__name__}), so it takes no '
            "arguments: drop them (a config file's args, KEY=VALUE on the command line) or point "
            "at a function that takes them and returns the application, e.g. "
            "def build_app(args: dict[str, str])"
        )
    return as_application(value, path, name)


def call_builder(builder: Callable[..., object], path: str, args: Mapping[str, object]) -> object:
    """What ``builder`` returns for ``args``: validated into its parameter's pydantic model
    if it has one, else given as a dict."""
    parameters = list(inspect.signature(builder).parameters.values())
    if len(parameters) != 1:
        raise ConfigError(
            f'Builder "{path}" must take exactly one argument (the args), it takes {len(parameters)}'
        )
    model = _model_of(builder, parameters[0].name)
    return builder(dict(args) if model is None else validate_args(model, path, args))


def validate_args(model: type[BaseModel], path: str, args: Mapping[str, object]) -> BaseModel:
    """``args`` as an instance of ``model``, or an error naming the key or field at fault."""
    if model.model_config.get("extra") != "allow":
        fields = _keys(model)
        # A pydantic-settings model (case_sensitive False, its default) takes any case.
        folded = model.model_config.get("case_sensitive") is False
        known = {field.lower() for field in fields} if folded else set(fields)
        for key in args:
            if (str(key).lower() if folded else key) not in known:
                raise BuilderArgsError(
                    f'Builder "{path}" takes no argument {key!r}: {_suggest(str(key), fields, model)}'
                )
    try:
        # A pydantic-settings model reads the environment too; keyword arguments win over it.
        return model(**{str(key): value for key, value in args.items()})
    except ValidationError as exc:
        raise BuilderArgsError(f'Invalid args for builder "{path}": {_explain(exc)}') from None


def as_application(value: object, path: str, name: str | None) -> Application:
    """What an import path names, as an application (routers are mounted in an App)."""
    from fastapi import APIRouter, FastAPI

    from app_toolkit.ingress import App

    if isinstance(value, Application):
        return value
    if isinstance(value, (FastAPI, APIRouter)):
        return App(value, name=name or "default")
    if isinstance(value, Deployment):
        raise ConfigError(
            f'"{path}" is a deployment; point at an application such as '
            f"{value.name}.bind() (assign it to a variable and use that)"
        )
    raise ConfigError(
        f'"{path}" is a {type(value).__name__}; expected an application '
        "(App(router) or Deployment.bind()), a FastAPI app, an APIRouter or a builder "
        "function returning one"
    )


def _model_of(builder: Callable[..., object], parameter: str) -> type[BaseModel] | None:
    """The pydantic model ``parameter`` is annotated with (``X | None``: X), if any."""
    try:
        annotation = typing.get_type_hints(builder).get(parameter)
    except Exception:  # noqa: BLE001 - unresolvable hints: the builder gets the plain dict
        return None
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [member for member in typing.get_args(annotation) if member is not type(None)]
        annotation = members[0] if len(members) == 1 else None
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _keys(model: type[BaseModel]) -> list[str]:
    """The keys ``model`` takes: its fields' names, and their aliases (each of an
    ``AliasChoices``; an ``AliasPath``'s first key)."""
    keys = list(model.model_fields)
    for field in model.model_fields.values():
        keys += [alias for alias in (field.alias, field.validation_alias) if isinstance(alias, str)]
        choices = field.validation_alias.choices if isinstance(field.validation_alias, AliasChoices) else []
        for choice in [*choices, field.validation_alias]:
            if isinstance(choice, str):
                keys.append(choice)
            elif isinstance(choice, AliasPath) and choice.path and isinstance(choice.path[0], str):
                keys.append(choice.path[0])
    return list(dict.fromkeys(keys))


def _suggest(key: str, fields: list[str], model: type[BaseModel]) -> str:
    close = difflib.get_close_matches(key, fields, n=1)
    if close:
        return f"did you mean {close[0]!r}? (a field of {model.__name__})"
    return f"{model.__name__}'s fields are {', '.join(sorted(model.model_fields))}"


def _explain(exc: ValidationError) -> str:
    """Each error of ``exc`` on one line's worth: the field, what is wrong, what was given."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"])
        secret = SECRET_OPTIONS.intersection(str(part) for part in error["loc"])
        given = (
            f" (got {error['input']!r})"
            if where and not secret and not isinstance(error["input"], dict)
            else ""
        )
        parts.append(f"{where}: {error['msg']}{given}" if where else error["msg"])
    return "; ".join(parts)
