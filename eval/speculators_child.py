"""Runs INSIDE the speculators venv (no dspark import): load a speculators-format DSpark export
with `speculators`, compare its tensors with the file, compute its draft logits on a sequence.

python eval/speculators_child.py EXPORT_DIR INPUTS.safetensors OUT.safetensors

The tapped target features are computed here, from the verifier named in the export's
config, as `cat(hidden_states[a] for a in aux_hidden_state_layer_ids)`: this checks the +1
layer-id convention independently of dspark's own capture.
"""

import json
import sys

import torch
from safetensors.torch import load_file, save_file


def main(export_dir: str, inputs_file: str, out_file: str) -> None:
    from speculators import SpeculatorModelConfig
    from speculators.models.dspark import DSparkDraftModel
    from transformers import AutoModelForCausalLM

    config = SpeculatorModelConfig.from_pretrained(export_dir)
    config.transformer_layer_config._attn_implementation = "eager"  # CPU: no flex compile
    model = DSparkDraftModel.from_pretrained(export_dir, config=config).float().eval()

    file_state = load_file(f"{export_dir}/model.safetensors")
    own = model.state_dict()
    report = {"class": type(model).__name__, "tensors_in_file": len(file_state)}
    report["missing_in_model"] = sorted(k for k in file_state if k not in own)
    report["max_abs_diff_tensors"] = max(
        float((own[k].float() - v.float()).abs().max()) for k, v in file_state.items() if k in own
    )

    ids = load_file(inputs_file)["input_ids"]  # [1, S]
    S = ids.shape[1]
    g = int(config.block_size)
    verifier = config.speculators_config.verifier.name_or_path
    target = AutoModelForCausalLM.from_pretrained(verifier, dtype=torch.float32).eval()
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
        tapped = torch.cat([hs[a] for a in config.aux_hidden_state_layer_ids], dim=-1)
        loss_mask = torch.ones_like(ids)
        n = S - g  # every valid position is an anchor: select_anchors keeps them all, sorted
        hidden, logits, _, _, idx = model._backbone_forward(
            tapped,
            ids,
            loss_mask,
            torch.zeros(1, S, config.transformer_layer_config.hidden_size),
            torch.zeros_like(ids),
            max_anchors=n,
        )
        blocks = ids[0, idx].view(n, g)  # sample_from_anchor: slot k's previous token is x_{p+k}
        hb = hidden.view(n, g, -1)
        emb = model.markov_head.prev_embeddings(blocks)
        bias = model.markov_head.block_bias(prev_token_ids=blocks, hidden_states=hb, prev_emb=emb)
        logits = logits.view(n, g, -1) + bias
        conf = model.confidence_head(torch.cat([hb, emb.to(hb.dtype)], dim=-1))
    save_file(
        {
            "logits": logits.reshape(n * g, -1).float().contiguous(),
            "confidence_logits": conf.reshape(-1).float().contiguous(),
            "tapped": tapped.float().contiguous(),
            "anchor_block_ids": idx.contiguous(),
        },
        out_file,
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
