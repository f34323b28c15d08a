"""Tools the LLM agent calls (read, write and edit files, compile, run the tests, profile, submit;
and, to write a reference from a description, try_reference).

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
from .reference import SUBMIT_REFERENCE, TRY_REFERENCE, ReferenceEnv, ReferenceReport, run_reference

__all__ = ["Tool", "ToolEnv", "ToolError", "Submission", "run_tool", "kernel_tools", "file_tools", "reference_tools",
           "ReferenceEnv", "ReferenceReport", "run_reference"]


def file_tools() -> "list[Tool[Any]]":
    """read_file, write_file, edit_file and list_files."""
    return [READ_FILE, WRITE_FILE, EDIT_FILE, LIST_FILES]


def kernel_tools() -> "list[Tool[Any]]":
    """The kernel-writing toolset: the file tools, compile, run_tests, profile and submit."""
    return [*file_tools(), COMPILE, RUN_TESTS, PROFILE, SUBMIT]


def reference_tools() -> "list[Tool[Any]]":
    """The reference-writing toolset (``forge new``): the file tools, try_reference and its submit
    (which takes the reference only once try_reference passed on it)."""
    return [*file_tools(), TRY_REFERENCE, SUBMIT_REFERENCE]
