"""Settings, read once from the environment or a ``.env`` file.

Each variable is the field's name in capitals, prefixed ``{{ cookiecutter.package_name.upper() }}_``.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="{{ cookiecutter.package_name.upper() }}_",
        env_file=".env",
        extra="ignore",
        frozen=True,
    )

    greeting: str = Field("Hello", min_length=1, description="How the greeter greets.")
    replicas: int = Field(1, ge=1, le=100, description="Replicas of the HTTP ingress.")
