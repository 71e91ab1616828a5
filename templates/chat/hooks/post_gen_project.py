"""Leave out the parts the user chose not to have."""

import shutil
from pathlib import Path

if not {{ cookiecutter.include_docker }}:
    Path("Dockerfile").unlink()
    Path(".dockerignore").unlink()
if not {{ cookiecutter.include_ci }}:
    shutil.rmtree(".github")
