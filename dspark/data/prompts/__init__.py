"""Prompt sets: the sources a job reads and the checks on prompts, before any model runs.

Row shapes normalised to `messages` (`rows`), the selected and rejected rows of a source
(`prompt_set`), file and `datasets` readers (`readers`), the loader behind every `--input`
(`sources`), the named public sets (`presets`, plain data), the embedded default set
(`embedded`), filters on generated prompts (`prompt_filter`) and fixed answers for
measurements (`fixed_answers`). Nothing here loads a model or imports a later stage.
"""
