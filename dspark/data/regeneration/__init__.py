"""Regeneration: the target answers (or writes) prompts, resumably.

The backend contract (`sampling`: `SamplingConfig`, `Reply`, `row_seed`), the backends
(`decoder_backend`, `hf_backend`, `openai_backend`), the resumable loop (`regenerate`) and its
output directory's files (`run_files`), and prompts the target writes itself (`magpie`).
"""
