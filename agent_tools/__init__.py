"""Tools the LLM agent calls (compile, run-tests, profile, read-file); built on the evaluator."""
