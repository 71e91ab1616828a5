"""Cookiecutter templates baked by ``app-toolkit new`` (shipped in the wheel as
``app_toolkit.templates``)."""
