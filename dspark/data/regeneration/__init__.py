"""Regeneration: the target answers (or writes) prompts, resumably."""
