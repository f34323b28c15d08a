"""The candidate evaluator: build, check, time and (optionally) profile one candidate kernel.

Every candidate, from the LLM agent or the built-in proposer, goes through ``Evaluator.evaluate``.
"""

from .api import EvalOptions, Evaluator  # noqa: F401
from .result import EvalResult  # noqa: F401
