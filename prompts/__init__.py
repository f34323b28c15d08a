"""Prompt templates for the LLM agent, as text files beside this module."""
