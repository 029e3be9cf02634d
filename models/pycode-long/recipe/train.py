"""Trains pycode-long from scratch on 16K-token windows of prep.py's train.bin.

The model is a plain PyTorch Llama (RMSNorm, RoPE, GQA attention through
scaled_dot_product_attention, SwiGLU, tied embeddings) whose parameters carry
the names of transformers' LlamaForCausalLM, so the exported folder loads there
and in Engram unchanged (test_equivalence() checks the logits against
transformers). Training runs for a wall-clock budget: AdamW, linear warm-up then
cosine decay to 10% of the peak over that budget (the schedule reads the elapsed
fraction of the budget), bf16 autocast, fp32 master weights, batches of random
16K windows drawn on the GPU from the token stream (seeded).

Writes to --export: config.json, model.safetensors (bf16) and the tokenizer files
copied from the model folder; to --log: one JSON line per logged step.
"""
import argparse, json, math, os, shutil, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
FOLDER = os.path.dirname(HERE)  # models/pycode-long: tokenizer files live there
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"]

SHAPE = dict(vocab_size=8192, hidden_size=384, intermediate_size=1024, num_hidden_layers=8,
             num_attention_heads=6, num_key_value_heads=2, head_dim=64, rope_theta=1_000_000.0,
             rms_norm_eps=1e-5, max_position_embeddings=16384)


def hf_config(shape):
    """config.json for transformers 5 and Engram (which reads the top-level rope_theta)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "hidden_act": "silu",
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
        "dtype": "bfloat16", "initializer_range": 0.02, "pretraining_tp": 1,
        "tie_word_embeddings": True, "use_cache": True,
        **{k: v for k, v in shape.items() if k != "rope_theta"},
        "rope_parameters": {"rope_theta": shape["rope_theta"], "rope_type": "default"},
        "rope_theta": shape["rope_theta"],
    }


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n)); self.eps = eps

    def forward(self, x):  # as transformers' LlamaRMSNorm
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, s):
        super().__init__()
        h, d, nh, nkv = s["hidden_size"], s["head_dim"], s["num_attention_heads"], s["num_key_value_heads"]
        self.nh, self.nkv, self.d = nh, nkv, d
        self.q_proj = nn.Linear(h, nh * d, bias=False)
        self.k_proj = nn.Linear(h, nkv * d, bias=False)
        self.v_proj = nn.Linear(h, nkv * d, bias=False)
        self.o_proj = nn.Linear(nh * d, h, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        q = (q.float() * cos + rotate_half(q.float()) * sin).to(v.dtype)  # RoPE in f32
        k = (k.float() * cos + rotate_half(k.float()) * sin).to(v.dtype)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1); v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.d))


class MLP(nn.Module):
    def __init__(self, s):
        super().__init__()
        h, f = s["hidden_size"], s["intermediate_size"]
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.input_layernorm = RMSNorm(s["hidden_size"], s["rms_norm_eps"])
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s["hidden_size"], s["rms_norm_eps"])
        self.mlp = MLP(s)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.embed_tokens = nn.Embedding(s["vocab_size"], s["hidden_size"])
        self.layers = nn.ModuleList(Layer(s) for _ in range(s["num_hidden_layers"]))
        self.norm = RMSNorm(s["hidden_size"], s["rms_norm_eps"])


class Llama(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s = s
        self.model = Inner(s)
        d = s["head_dim"]
        self.register_buffer("inv_freq", 1.0 / (s["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)), persistent=False)
        std, n = 0.02, s["num_hidden_layers"]
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=std / math.sqrt(2 * n) if name.endswith(("o_proj.weight", "down_proj.weight")) else std)

    def rope(self, T, device, dtype):
        pos = torch.arange(T, device=device, dtype=torch.float32)
        f = torch.outer(pos, self.inv_freq.float())
        emb = torch.cat((f, f), dim=-1)
        return emb.cos().to(dtype)[None, None], emb.sin().to(dtype)[None, None]

    def forward(self, ids, targets=None):
        x = self.model.embed_tokens(ids)
        cos, sin = self.rope(ids.shape[1], ids.device, torch.float32)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        logits = F.linear(x, self.model.embed_tokens.weight)  # tied lm_head
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    def hf_state_dict(self, dtype=torch.bfloat16):
        return {k: v.detach().to(dtype).contiguous().cpu() for k, v in self.state_dict().items()}


def export(model, folder):
    from safetensors.torch import save_file
    os.makedirs(folder, exist_ok=True)
    save_file(model.hf_state_dict(), os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    json.dump(hf_config(model.s), open(os.path.join(folder, "config.json"), "w"), indent=2)
    for f in TOKENIZER_FILES:
        if os.path.abspath(os.path.join(FOLDER, f)) != os.path.abspath(os.path.join(folder, f)):
            shutil.copy(os.path.join(FOLDER, f), os.path.join(folder, f))


def test_equivalence(shape=None):
    """Logits of this model and of transformers' LlamaForCausalLM on the exported weights (f32)."""
    import tempfile
    from transformers import AutoModelForCausalLM
    s = dict(shape or SHAPE, num_hidden_layers=2)
    torch.manual_seed(0)
    m = Llama(s)
    with tempfile.TemporaryDirectory() as d:
        from safetensors.torch import save_file
        export(m, d)
        save_file({k: v.float().contiguous() for k, v in m.state_dict().items()}, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        ids = torch.randint(0, s["vocab_size"], (2, 300))
        with torch.no_grad():
            a = m(ids); b = hf(input_ids=ids).logits
    err = (a - b).abs().max().item()
    print("equivalence: max |logit diff| vs transformers", err, flush=True)
    assert err < 1e-3, err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="prep.py's --out folder")
    ap.add_argument("--export", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--budget", type=float, default=330, help="training seconds (the LR schedule spans them)")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=8, help="windows per step")
    ap.add_argument("--lr", type=float, default=2.5e-3)
    ap.add_argument("--warmup", type=float, default=0.05, help="fraction of the budget")
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--val-every", type=float, default=60, help="seconds")
    ap.add_argument("--shape", default="", help="JSON overrides of SHAPE (tests)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    shape = dict(SHAPE, **json.loads(a.shape or "{}"))
    dev = a.device
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.cudnn.allow_tf32 = True
    log = open(a.log, "a")

    def emit(d):
        line = json.dumps(d); print(line, flush=True); print(line, file=log, flush=True)

    train = torch.from_numpy(np.fromfile(os.path.join(a.data, "train.bin"), dtype=np.uint16).astype(np.int32)).to(dev)
    held = np.fromfile(os.path.join(a.data, "heldout.bin"), dtype=np.uint16)
    offs = json.load(open(os.path.join(a.data, "heldout.json")))
    # validation: the first seq+1 tokens of the 4 longest held-out units (fixed)
    longest = sorted(offs, key=lambda n: offs[n][0] - offs[n][1])[:4]
    val = [torch.from_numpy(held[offs[n][0]: offs[n][0] + a.seq + 1].astype(np.int64)) for n in longest]
    val = [v for v in val if len(v) == a.seq + 1]
    model = Llama(shape).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    emit({"event": "start", "params": n_params, "train_tokens_available": int(train.numel()), "shape": shape,
          "device": torch.cuda.get_device_name() if dev == "cuda" else dev, "args": vars(a), "val_units": longest})
    fused = dev == "cuda"
    decay = [p for p in model.parameters() if p.dim() >= 2]; nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    gen = torch.Generator(device=dev); gen.manual_seed(a.seed)
    ar = torch.arange(a.seq + 1, device=dev)
    amp = torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda")  # bf16 on the GPU; f32 on a CPU (tests)

    def lr_at(frac):
        if frac < a.warmup:
            return a.lr * max(frac / a.warmup, 0.01)
        p = min(1.0, (frac - a.warmup) / (1 - a.warmup))
        return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))

    def evaluate():
        model.eval(); tot = 0.0
        with torch.no_grad(), amp:
            for v in val:
                v = v.to(dev)[None]
                tot += model(v[:, :-1], v[:, 1:]).item()
        model.train()
        return tot / max(1, len(val))

    micro, accum = a.batch, 1
    step, tokens, t0 = 0, 0, time.time()
    last_val = t0
    while True:
        el = time.time() - t0
        if el >= a.budget or (a.max_steps and step >= a.max_steps):
            break
        lr = lr_at(el / a.budget)
        for g in opt.param_groups: g["lr"] = lr
        try:
            tot = 0.0
            for _ in range(accum):
                starts = torch.randint(0, train.numel() - a.seq - 1, (micro,), device=dev, generator=gen)
                chunk = train[starts[:, None] + ar].long()
                with amp:
                    loss = model(chunk[:, :-1], chunk[:, 1:]) / accum
                loss.backward(); tot += loss.detach()
        except torch.OutOfMemoryError:
            if micro == 1:
                raise
            opt.zero_grad(set_to_none=True); loss = None; torch.cuda.empty_cache()
            micro //= 2; accum *= 2
            emit({"event": "oom", "micro_batch": micro, "accum": accum})
            continue
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); opt.zero_grad(set_to_none=True)
        step += 1; tokens += a.batch * a.seq
        if step % 10 == 0 or step <= 3:
            emit({"step": step, "loss": round(tot.item(), 4), "gnorm": round(gn.item(), 3), "lr": round(lr, 6),
                  "tokens": tokens, "t": round(time.time() - t0, 1)})
        if time.time() - last_val >= a.val_every:
            last_val = time.time()
            emit({"step": step, "val_loss": round(evaluate(), 4), "t": round(time.time() - t0, 1)})
    train_s = time.time() - t0
    vl = evaluate()
    emit({"event": "end", "steps": step, "tokens": tokens, "train_s": round(train_s, 1), "final_val_loss": round(vl, 4),
          "micro_batch": micro, "accum": accum, "params": n_params,
          "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1) if dev == "cuda" else None})
    export(model, a.export)
    emit({"event": "exported", "folder": a.export})


if __name__ == "__main__":
    main()
