"""Tools the LLM agent calls (read, write and edit files, compile, run the tests, profile, submit).

Tools are data (``Tool``: a name, a description, a pydantic model of the arguments, a function)
that render to Anthropic's and OpenAI's tool formats alike; they act only on a ``ToolEnv`` (the
node's working directory, the card and the evaluator pool) and ``run_tool`` turns every call, good
or bad, into a ``ToolResult`` the model reads. They run without the app or any model.
"""

from __future__ import annotations

from typing import Any

from .base import Submission, Tool, ToolEnv, ToolError, run_tool
from .evaluate import COMPILE, PROFILE, RUN_TESTS, SUBMIT
from .files import EDIT_FILE, LIST_FILES, READ_FILE, WRITE_FILE

__all__ = ["Tool", "ToolEnv", "ToolError", "Submission", "run_tool", "kernel_tools", "file_tools"]


def file_tools() -> "list[Tool[Any]]":
    """read_file, write_file, edit_file and list_files."""
    return [READ_FILE, WRITE_FILE, EDIT_FILE, LIST_FILES]


def kernel_tools() -> "list[Tool[Any]]":
    """The kernel-writing toolset: the file tools, compile, run_tests, profile and submit."""
    return [*file_tools(), COMPILE, RUN_TESTS, PROFILE, SUBMIT]
