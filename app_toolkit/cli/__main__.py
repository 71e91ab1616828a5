"""``python -m app_toolkit.cli``: the ``app-toolkit`` command."""

from app_toolkit.cli import main

main()
