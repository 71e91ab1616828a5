"""Refuse names that would not make a working project, before anything is written."""

import re
import sys

SLUG = "{{ cookiecutter.project_slug }}"
PACKAGE = "{{ cookiecutter.package_name }}"

if not re.fullmatch(r"[a-z][a-z0-9-]*", SLUG):
    sys.exit(f"project_slug {SLUG!r} must be lowercase letters, digits and dashes, starting with a letter")
if not PACKAGE.isidentifier() or not PACKAGE.islower():
    sys.exit(f"package_name {PACKAGE!r} must be a lowercase Python identifier, e.g. my_service")
