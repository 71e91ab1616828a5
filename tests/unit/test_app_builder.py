"""Application builders get their arguments by one rule, from a config file's ``args`` or
from ``app-toolkit run``'s KEY=VALUE pairs (Ray Serve's ``serve run module:builder k=v``)."""

from __future__ import annotations

from typing import Any, Optional

import pytest
from click.testing import CliRunner
from pydantic import AliasChoices, BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

import app_toolkit as tk
from app_toolkit.app_builder import call_builder, load_application, validate_args
from app_toolkit.build import build_spec
from app_toolkit.cli import main
from app_toolkit.cli.serve import _is_config_file
from app_toolkit.cli.session import key_values
from app_toolkit.config.file import parse_config
from app_toolkit.exceptions import BuilderArgsError
from examples.chat.chat.settings import Settings as ChatSettings
from tests.apps import config_apps


class Knobs(BaseModel):  # extra="ignore", pydantic's default
    greeting: str = "Hello"
    replicas: int = Field(1, ge=1, le=8)


class EnvKnobs(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KNOBS_", extra="ignore")

    greeting: str = "Hello"
    replicas: int = 1
    region: str = Field("eu", validation_alias=AliasChoices("region", "zone"))


def test_key_value_pairs_become_a_dict_of_strings() -> None:
    pairs = ("a=1", "url=http://x/?q=1", "a=2", "empty=")
    assert key_values(pairs, "a=1") == {"a": "2", "url": "http://x/?q=1", "empty": ""}
    assert key_values((), "a=1") == {}
    for malformed in ("backend", "=echo", " =echo"):
        with pytest.raises(tk.ConfigError, match=f'"{malformed}" must look like key=value, e.g. a=1'):
            key_values((malformed,), "a=1")


def test_run_refuses_a_malformed_pair_as_a_usage_error() -> None:
    # Refused while the command line is read, before the command imports or starts anything.
    result = CliRunner().invoke(main, ["run", "examples.demo:app", "--local", "backend"])
    assert result.exit_code == 2
    assert '"backend" must look like key=value, e.g. backend=echo' in result.output


def test_a_builder_without_a_model_gets_the_dict() -> None:
    seen: list[object] = []

    def build(args: dict[str, str]) -> None:
        seen.append(args)

    def untyped(args):  # type: ignore[no-untyped-def]  # no annotation at all
        seen.append(args)

    call_builder(build, "m:build", {"model": "small"})
    call_builder(untyped, "m:untyped", {})
    assert seen == [{"model": "small"}, {}]


def test_a_model_builder_gets_the_arguments_validated() -> None:
    seen: list[Any] = []

    def plain(args: Knobs) -> None:
        seen.append(args)

    def optional(settings: Knobs | None = None) -> None:
        seen.append(settings)

    def old_optional(settings: Optional[Knobs] = None) -> None:  # noqa: UP045 - the typing spelling too
        seen.append(settings)

    for builder in (plain, optional, old_optional):
        call_builder(builder, "m:build", {"greeting": "Hi", "replicas": "3"})
    assert seen == [Knobs(greeting="Hi", replicas=3)] * 3
    call_builder(optional, "m:build", {})  # no arguments: the model's defaults, not None
    assert seen[-1] == Knobs()


def test_an_unknown_key_is_named_though_the_model_ignores_extras() -> None:
    with pytest.raises(BuilderArgsError, match="takes no argument 'greting': did you mean 'greeting'"):
        validate_args(Knobs, "m:build", {"greting": "Hi"})
    with pytest.raises(BuilderArgsError, match="no argument 'zzz': Knobs's fields are greeting, replicas"):
        validate_args(Knobs, "m:build", {"zzz": "1"})


def test_a_bad_value_names_the_field_and_what_was_given() -> None:
    with pytest.raises(BuilderArgsError) as caught:
        validate_args(Knobs, "m:build", {"replicas": "9"})
    assert str(caught.value) == (
        "Invalid args for builder \"m:build\": replicas: Input should be less than or equal to 8 (got '9')"
    )


def test_arguments_win_over_the_environment_of_a_settings_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KNOBS_GREETING", "Hey")
    monkeypatch.setenv("KNOBS_REPLICAS", "2")
    assert validate_args(EnvKnobs, "m:build", {"greeting": "Hi"}) == EnvKnobs(greeting="Hi", replicas=2)
    with pytest.raises(BuilderArgsError, match="takes no argument 'replica': did you mean 'replicas'"):
        validate_args(EnvKnobs, "m:build", {"replica": "3"})


def test_a_settings_model_takes_what_it_would_take_itself_any_case_and_alias_choices() -> None:
    # pydantic-settings matches keyword arguments in any case (case_sensitive=False) and
    # by each of a field's AliasChoices: so do the builder's arguments.
    taken = validate_args(EnvKnobs, "m:build", {"GREETING": "Hi", "zone": "us"})
    assert (taken.greeting, taken.region) == ("Hi", "us")  # type: ignore[attr-defined]
    with pytest.raises(BuilderArgsError, match="takes no argument 'GREETINGS'"):
        validate_args(EnvKnobs, "m:build", {"GREETINGS": "Hi"})
    with pytest.raises(BuilderArgsError, match="takes no argument 'Greeting'"):
        validate_args(Knobs, "m:build", {"Greeting": "Hi"})  # a plain model: its own case only


def test_the_chat_templates_settings_take_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAT_BACKEND", "openai")
    settings = validate_args(ChatSettings, "chat.app:build_app", {"backend": "echo", "max_batch_size": "4"})
    assert isinstance(settings, ChatSettings)
    assert (settings.backend, settings.max_batch_size) == ("echo", 4)
    with pytest.raises(BuilderArgsError, match="takes no argument 'bakend': did you mean 'backend'"):
        validate_args(ChatSettings, "chat.app:build_app", {"bakend": "echo"})
    with pytest.raises(BuilderArgsError, match="max_batch_size: Input should be less than or equal to 64"):
        validate_args(ChatSettings, "chat.app:build_app", {"max_batch_size": "100"})


def test_only_a_builder_takes_arguments() -> None:
    with pytest.raises(BuilderArgsError, match=r"not a builder function \(it is a App\), so it takes no arg"):
        load_application("examples.demo:app", {"x": "1"}, None)
    assert isinstance(load_application("tests.apps.config_apps:build", {}, None), tk.Application)


def test_run_reads_a_dotted_target_as_an_import_path() -> None:
    """``app-toolkit run chat.app.app`` as Ray Serve's ``serve run`` takes it: a name ending
    .yaml/.yml, or a file without a colon, is a config file; anything else an import path."""
    assert not _is_config_file("tests.apps.config_apps.hello")
    assert _is_config_file("serve.yaml") and not _is_config_file("tests.apps.config_apps:hello")
    assert load_application("tests.apps.config_apps.hello", {}, None) is config_apps.hello
    built = load_application("tests.apps.config_apps.build", {"greeting": "Hi"}, None)
    assert isinstance(built, tk.Application)


def test_a_config_files_args_go_by_the_same_rule() -> None:
    entry = {"name": "a", "route_prefix": "/", "import_path": "tests.apps.config_apps:build"}
    config = parse_config({"applications": [{**entry, "args": {"greting": "Hi"}}]}, "serve.yaml")
    with pytest.raises(BuilderArgsError, match="^args: .* no argument 'greting': did you mean 'greeting'"):
        build_spec(config.applications[0], lambda value: b"")
