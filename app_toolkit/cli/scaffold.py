"""Project templates: list them, and bake one into a new project (``app-toolkit new``).

The templates are cookiecutter templates shipped inside the package
(``app_toolkit.templates``: ``service``, ``chat``); baking goes through cookiecutter's
Python API, after checks that turn its failures into messages saying what to do.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from importlib import metadata, resources
from pathlib import Path
from urllib.parse import unquote, urlparse

from app_toolkit import __version__
from app_toolkit.exceptions import ConfigError

SLUG = re.compile(r"[a-z][a-z0-9-]*")


def templates_root() -> Path:
    """The folder holding one sub-folder per template."""
    return Path(str(resources.files("app_toolkit.templates")))


def list_templates() -> dict[str, str]:
    """Template name -> its description (from its ``cookiecutter.json``)."""
    found = {}
    for folder in sorted(templates_root().iterdir()):
        spec = folder / "cookiecutter.json"
        if spec.is_file():
            found[folder.name] = str(json.loads(spec.read_text(encoding="utf-8")).get("description", ""))
    return found


def bake(
    template: str,
    output_dir: str | Path = ".",
    *,
    context: Mapping[str, str] | None = None,
    no_input: bool = False,
    force: bool = False,
    toolkit_source: str | None = None,
) -> Path:
    """Create a project from ``template`` in ``output_dir``; returns the project's folder.

    ``context`` overrides the template's variables (unknown names are refused). Without
    ``force``, an existing project folder is an error and nothing is written. The
    project's Makefile installs app_toolkit from ``toolkit_source`` (default: where this
    one was installed from, see :func:`installed_from`) while that exists.
    """
    from cookiecutter.exceptions import CookiecutterException, FailedHookException, OutputDirExistsException
    from cookiecutter.main import cookiecutter

    available = list_templates()
    if template not in available:
        raise ConfigError(f"No template {template!r}; choose one of: {', '.join(available)}")
    folder = templates_root() / template
    variables = json.loads((folder / "cookiecutter.json").read_text(encoding="utf-8"))
    context = dict(context or {})
    unknown = sorted(set(context) - {name for name in variables if not name.startswith("_")})
    if unknown:
        known = ", ".join(name for name in variables if not name.startswith("_"))
        raise ConfigError(f"Template {template!r} has no variable {', '.join(unknown)}; it has: {known}")
    _check_names(context)
    context["_toolkit_version"] = __version__  # the generated project asks for this release or newer
    context["_app_toolkit"] = installed_from() if toolkit_source is None else toolkit_source
    quiet = logging.getLogger("cookiecutter")
    level, quiet.level = quiet.level, logging.CRITICAL  # its tracebacks say less than our errors
    try:
        baked = cookiecutter(
            str(folder),
            no_input=no_input,
            extra_context=context,
            output_dir=str(output_dir),
            overwrite_if_exists=force,
            accept_hooks=True,
        )
    except OutputDirExistsException as exc:
        where = str(exc).removeprefix("Error: ")
        raise ConfigError(
            f"{where}; choose another name or output folder, or pass --force to overwrite"
        ) from None
    except FailedHookException as exc:
        raise ConfigError(f"The template refused these values: {exc}") from None
    except CookiecutterException as exc:
        raise ConfigError(f"Could not create the project: {exc}") from None
    finally:
        quiet.level = level
    return Path(baked)


def installed_from() -> str:
    """The folder or file pip installed this app_toolkit from (its PEP 610
    ``direct_url.json``), or the source tree it is imported from; "" for a release from a
    package index, which the project then asks its own index for."""
    try:
        direct = metadata.distribution("app_toolkit").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        direct = None
    if direct:
        url = urlparse(json.loads(direct).get("url", ""))
        if url.scheme == "file" and Path(unquote(url.path)).exists():
            return unquote(url.path)
    checkout = Path(__file__).resolve().parents[2]
    pyproject = checkout / "pyproject.toml"
    if pyproject.is_file() and 'name = "app_toolkit"' in pyproject.read_text(encoding="utf-8"):
        return str(checkout)
    return ""


def _check_names(context: Mapping[str, str]) -> None:
    """The same rules as the templates' own pre-generation hook, checked before it runs."""
    slug = context.get("project_slug")
    if slug is not None and not SLUG.fullmatch(slug):
        raise ConfigError(
            f"project_slug {slug!r} must be lowercase letters, digits and dashes, starting with a letter"
        )
    package = context.get("package_name")
    if package is not None and not (package.isidentifier() and package.islower()):
        raise ConfigError(f"package_name {package!r} must be a lowercase Python identifier, e.g. my_service")
