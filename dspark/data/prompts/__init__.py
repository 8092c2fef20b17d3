"""Prompt sets: the sources a job reads and the checks on prompts, before any model runs."""
