"""A Mixtral GGUF (llama.cpp's `llama` architecture with `ffn_*_exps` expert tensors) as a
transformers `MixtralForCausalLM` on its dequantized weights: the float32 reference for files
that transformers' own GGUF loader reads as a dense Llama (it has no Mixtral mapping).

Every tensor is dequantized with the `gguf` package (`gguf.quants.dequantize`, a NumPy port of
ggml's `dequantize_row_*`, MXFP4 included); q/k rows get llama.cpp's permutation undone as
transformers does for `llama`; `ffn_gate_exps`/`ffn_up_exps` become the model's fused
`gate_up_proj` (gate rows first), `ffn_down_exps` its `down_proj`, `ffn_gate_inp` the router.
"""

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from transformers import MixtralConfig, MixtralForCausalLM


def is_mixtral(path):
    """Whether the file is a `llama`-architecture GGUF with expert tensors."""
    r = GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    return arch == "llama" and any(t.name.endswith("ffn_gate_exps.weight") for t in r.tensors)


def _unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf's `LlamaModel.permute` on q/k rows."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def load(path):
    """`MixtralForCausalLM` (float32, eval mode) holding the file's dequantized weights."""
    r = GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if k.startswith("llama.")}
    tensors = {}
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type).astype(np.float32)
        tensors[t.name] = x.reshape(tuple(int(d) for d in reversed(t.shape)))
    n_head, n_kv = int(meta["llama.attention.head_count"]), int(meta["llama.attention.head_count_kv"])
    hidden = int(meta["llama.embedding_length"])
    cfg = MixtralConfig(
        vocab_size=tensors["token_embd.weight"].shape[0], hidden_size=hidden,
        intermediate_size=tensors["blk.0.ffn_gate_exps.weight"].shape[1],
        num_hidden_layers=int(meta["llama.block_count"]), num_attention_heads=n_head, num_key_value_heads=n_kv,
        head_dim=hidden // n_head, max_position_embeddings=int(meta["llama.context_length"]),
        rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
        num_local_experts=int(meta["llama.expert_count"]), num_experts_per_tok=int(meta["llama.expert_used_count"]),
        tie_word_embeddings="output.weight" not in tensors, sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0))})
    sd = {"model.embed_tokens.weight": tensors["token_embd.weight"], "model.norm.weight": tensors["output_norm.weight"]}
    if "output.weight" in tensors:
        sd["lm_head.weight"] = tensors["output.weight"]
    for i in range(cfg.num_hidden_layers):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = tensors[b + "attn_norm.weight"]
        sd[p + "post_attention_layernorm.weight"] = tensors[b + "ffn_norm.weight"]
        sd[p + "self_attn.q_proj.weight"] = _unpermute(tensors[b + "attn_q.weight"], n_head)
        sd[p + "self_attn.k_proj.weight"] = _unpermute(tensors[b + "attn_k.weight"], n_kv)
        sd[p + "self_attn.v_proj.weight"] = tensors[b + "attn_v.weight"]
        sd[p + "self_attn.o_proj.weight"] = tensors[b + "attn_output.weight"]
        sd[p + "mlp.gate.weight"] = tensors[b + "ffn_gate_inp.weight"]
        sd[p + "mlp.experts.gate_up_proj"] = np.concatenate(
            [tensors[b + "ffn_gate_exps.weight"], tensors[b + "ffn_up_exps.weight"]], axis=1)
        sd[p + "mlp.experts.down_proj"] = tensors[b + "ffn_down_exps.weight"]
    model = MixtralForCausalLM(cfg).to(torch.float32)
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.eval()
