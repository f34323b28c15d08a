"""What pyproject.toml cannot say: the repository's top-level ``prompts/`` folder is installed as
``forge_tui/prompts/``, data of ``forge_tui`` (``forge_tui.agent.context`` reads it), so that no
top-level package named ``prompts`` is installed. Everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["forge_tui*", "agent_tools*"]), "forge_tui.prompts"],
    package_dir={"forge_tui.prompts": "prompts"},
)
