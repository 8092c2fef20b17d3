"""A draft in a cheaper dtype than its target (bf16 draft, fp32 target: the CPU/AMX setting the
benchmark's `draft_dtype` selects) proposes differently but decodes losslessly."""

import pytest
import torch
from helpers import greedy_reference, prompts_for, real_draft

from dspark.decoding import SpeculativeDecoder


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_bf16_draft_with_fp32_target_equals_plain_greedy(tiny_target, arch):
    model, tok = tiny_target(arch)
    draft = real_draft(model, tok).to(torch.bfloat16)
    assert next(model.parameters()).dtype == torch.float32
    prompts = prompts_for(model.config.vocab_size, (5, 9), 31)
    out = SpeculativeDecoder(model, draft).generate(prompts, 12)
    assert out.sequences == [greedy_reference(model, p, 12) for p in prompts]
    assert sum(map(sum, out.verify_lengths)) > 0  # drafts were proposed and verified
