#!/usr/bin/env python3
"""Upcycles a trained dense Llama-family GGUF into a Mixtral (MoE) Hugging Face folder whose
output equals the dense model's: the trained MoE that llama.cpp's MXFP4_MOE quantizer needs.

Every expert is a copy of the dense MLP (gate/up/down), the router is small random (seeded), and
Mixtral renormalizes its top-k softmax weights to sum to 1, so whatever the routing the layer
computes sum_k w_k * MLP(x) = MLP(x): the MoE is exactly as good as the trained dense model. The
dense weights come from the GGUF through transformers (`gguf_file=`, which dequantizes them and
undoes llama.cpp's q/k row permutation); the folder is written in the checkpoint layout that
llama.cpp's `convert_hf_to_gguf.py` reads (`block_sparse_moe.experts.E.w1/w2/w3`, float32),
with the GGUF's tokenizer saved beside it. The script then reloads the folder as
`MixtralForCausalLM` and checks its logits against the dense model's on the first tokens of
--text (printed; it fails when they differ beyond float tolerance).

    VENV_T/bin/python scripts/upcycle_moe.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out DIR \
        [--experts 4] [--top-k 2] [--router-std 0.02] [--expert-noise 0] [--seed 0] [--text FILE]

With --expert-noise F the experts differ (each is the dense MLP plus Gaussian noise of F times
the tensor's RMS), so which experts the router picks changes the output: the MoE is then close
to the dense model, not equal, and the check only prints the difference.
"""

import argparse
import json
import os

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, MixtralConfig, MixtralForCausalLM


def mixtral_config(dense, experts, top_k):
    c = dense.config
    rope = dict(c.rope_parameters) if getattr(c, "rope_parameters", None) else {"rope_type": "default", "rope_theta": c.rope_theta}
    return MixtralConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                         num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                         num_key_value_heads=c.num_key_value_heads, head_dim=c.hidden_size // c.num_attention_heads,
                         hidden_act=c.hidden_act, max_position_embeddings=c.max_position_embeddings,
                         rms_norm_eps=c.rms_norm_eps, bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id,
                         pad_token_id=c.pad_token_id, tie_word_embeddings=c.tie_word_embeddings, sliding_window=None,
                         num_local_experts=experts, num_experts_per_tok=top_k, rope_parameters=rope,
                         architectures=["MixtralForCausalLM"])


def upcycled_state(dense, cfg, router_std, expert_noise, seed):
    """Mixtral tensors in the original checkpoint layout: the dense MLP copied into every expert
    (plus, with `expert_noise` > 0, Gaussian noise of that many times the tensor's RMS)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in dense.state_dict().items():
        t = t.detach().to(torch.float32).contiguous()
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if ".mlp." not in name:
            out[name] = t.clone()
            continue
        prefix, proj = name.split(".mlp.")
        w = {"gate_proj.weight": "w1", "down_proj.weight": "w2", "up_proj.weight": "w3"}[proj]
        rms = t.pow(2).mean().sqrt()
        for e in range(cfg.num_local_experts):
            noise = torch.randn(t.shape, generator=g) * (expert_noise * rms) if expert_noise > 0 else 0
            out[f"{prefix}.block_sparse_moe.experts.{e}.{w}.weight"] = t + noise
        gate = f"{prefix}.block_sparse_moe.gate.weight"
        if gate not in out:
            out[gate] = torch.randn(cfg.num_local_experts, cfg.hidden_size, generator=g) * router_std
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--router-std", type=float, default=0.02)
    ap.add_argument("--expert-noise", type=float, default=0.0,
                    help="perturb each expert by this fraction of the tensor's RMS, so routing matters")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--check-tokens", type=int, default=256)
    a = ap.parse_args()
    d, f = os.path.split(os.path.abspath(a.gguf))
    dense = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    cfg = mixtral_config(dense, a.experts, a.top_k)
    os.makedirs(a.out, exist_ok=True)
    cfg.save_pretrained(a.out)
    save_file(upcycled_state(dense, cfg, a.router_std, a.expert_noise, a.seed), os.path.join(a.out, "model.safetensors"),
              metadata={"format": "pt"})
    tok.save_pretrained(a.out)

    moe = MixtralForCausalLM.from_pretrained(a.out, dtype=torch.float32).eval()
    ids = tok(open(a.text, encoding="utf-8").read(), return_tensors="pt").input_ids[:, : a.check_tokens]
    with torch.no_grad():
        ld = dense(ids).logits[0]
        out = moe(ids, output_router_logits=True)
    lm, routes = out.logits[0], out.router_logits
    top = torch.stack([r.topk(a.top_k, dim=-1).indices.sort(dim=-1).values for r in routes])  # layers x tokens x k
    distinct = len({tuple(x.tolist()) for x in top.reshape(-1, a.top_k)})
    diff = (ld - lm).abs().max().item()
    report = {"tokens": ids.shape[1], "max_abs_logit_diff": diff, "logit_scale": ld.abs().max().item(),
              "argmax_equal": int((ld.argmax(-1) == lm.argmax(-1)).sum()), "distinct_expert_pairs_used": distinct}
    print(json.dumps(report))
    if a.expert_noise == 0 and diff > 1e-3 * max(1.0, report["logit_scale"]):
        raise SystemExit(f"MoE logits differ from the dense model's by {diff}")


if __name__ == "__main__":
    main()
