"""Runnable example: a tiny random Qwen3 target and a random draft, decoded through
`target.generate(custom_generate=...)`, compared with plain greedy `generate()`.

python examples/dspark_generate/run.py
"""

from pathlib import Path

import torch

from dspark.config import DSparkConfig, choose_mask_token_id
from dspark.modeling import DSparkDraftModel
from dspark.target import load_target

HERE = Path(__file__).resolve().parent


def main() -> None:
    target, tok = load_target("tiny-qwen3")
    cfg = DSparkConfig.from_target_config(
        target.config,
        num_hidden_layers=1,
        markov_rank=8,
        block_size=4,
        mask_token_id=choose_mask_token_id(tok, target.config.vocab_size),
    )
    torch.manual_seed(0)
    draft = DSparkDraftModel.from_target(target, cfg).eval()
    tok.padding_side = "left"  # decoder-only batches: plain generate() needs left padding
    enc = tok(["def add(a, b):", "The answer is"], return_tensors="pt", padding=True)
    plain = target.generate(**enc, max_new_tokens=16, do_sample=False)
    spec = target.generate(
        **enc,
        max_new_tokens=16,
        do_sample=False,
        custom_generate=str(HERE),
        trust_remote_code=True,
        draft=draft,
    )
    for row in spec:
        print(repr(tok.decode(row, skip_special_tokens=True)))
    w = min(spec.shape[1], plain.shape[1])
    same = torch.equal(spec[:, :w], plain[:, :w])
    print("equals plain greedy generate():", same)


if __name__ == "__main__":
    main()
