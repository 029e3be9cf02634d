#!/usr/bin/env python3
"""Reference outputs of the per-architecture fixtures computed by Hugging Face transformers.

For each shape (`tiny-qwen3`: Qwen3ForCausalLM, `tiny-phi3`: Phi3ForCausalLM,
`tiny-gemma3`: Gemma3ForCausalLM with a 16-position sliding window, `tiny-gemma2`:
Gemma2ForCausalLM, alternating sliding layers and softcapping; `tiny-qwen3-moe`:
Qwen3MoeForCausalLM, 8 experts, 2 per token; `tiny-mixtral`: MixtralForCausalLM, 8 experts,
2 per token; `tiny-gpt-oss`: GptOssForCausalLM, alternating 16-position sliding and global
layers, attention sinks, YaRN, 4 of 8 experts with biases and the clamped SwiGLU;
`tiny-mistral-swa` and
`tiny-smollm3`: `tiny` read as Mistral with a 16-position window, and as SmolLM3 with its
second layer NoPE) this
generates the fixture's Hugging Face folder with `engram fixture`, loads it with
transformers (f32, eager attention), checks that transformers built the intended
class, and writes `crates/model/tests/golden/<shape>.json`: the fixture's identity,
a prompt of a few hundred tokens with its ids, the last-position logits, the argmax
at every position, a 32-token greedy continuation, and the chat template rendered
by `apply_chat_template` for a system prompt and two user turns (for Qwen3 also
with `enable_thinking=False`). The Rust tests in `crates/model/tests/it/arch_golden.rs`
compare Engram against these files on the HF folder and on its GGUF conversion.

Usage (from the repository root):

    cargo build --release -p engram-cli
    /work/venv-torch/bin/python scripts/golden_arch.py                  # both shapes
    /work/venv-torch/bin/python scripts/golden_arch.py --shape tiny-qwen3

Needs `torch` and `transformers` (CPU is enough). Not run by CI.
"""

import argparse
import copy
import json
import os
import platform
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_logits import fnv1a64, safetensors_edges, sha256, sig7  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_DIR = os.path.join(REPO, "crates", "model", "tests", "golden")
DEFAULT_ENGRAM = os.path.join(REPO, "target", "release", "engram")

# The class transformers must build from each shape's config.json.
SHAPES = {
    "tiny-qwen3": "Qwen3ForCausalLM",
    "tiny-phi3": "Phi3ForCausalLM",
    "tiny-gemma3": "Gemma3ForCausalLM",
    "tiny-gemma2": "Gemma2ForCausalLM",
    "tiny-mistral-swa": "MistralForCausalLM",
    "tiny-smollm3": "SmolLM3ForCausalLM",
    "tiny-qwen3-moe": "Qwen3MoeForCausalLM",
    "tiny-mixtral": "MixtralForCausalLM",
    "tiny-gpt-oss": "GptOssForCausalLM",
}

# Goldens made from another shape's folder with config.json fields changed: `tiny-mistral-swa`
# is `tiny` read as a Mistral whose 16-position sliding window applies to every layer (the
# Rust test makes the same edit; GGUF is not compared, as llama.cpp's converter writes Mistral
# as `llama` and drops the window).
EDITS = {
    "tiny-mistral-swa": ("tiny", {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 16}),
    # `tiny` read as SmolLM3 with its second layer NoPE (the two-layer fixture has no fourth).
    "tiny-smollm3": ("tiny", {"model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"], "no_rope_layers": [1, 0], "pad_token_id": None}),
}

# A few hundred tokens of the fixture tokenizer (the Rust tests read the text back from
# the golden file and check that Engram's tokenizer gives the same ids).
PROMPT = (
    "The persistent stream holds immutable system prompts \u2014 and a caf\u00e9's \u65e5\u672c\u8a9e menu. "
    "An inference runtime keeps the keys and values of every token it has seen, so that the next "
    "token attends to the whole conversation without computing it again. When an agent returns "
    "after an hour, the runtime finds the blocks of its earlier turns, checks their fingerprints, "
    "and resumes where it stopped; only the new message is processed. "
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(prog='engram')\n"
    "    parser.add_argument('--model', required=True)\n    return parser.parse_args(argv)\n"
    "Numbers such as 1234567, 89.5e-3 and 2026-11-29 are split into digits; contractions like "
    "it's, we'll and I'D are kept apart. Rotary embeddings turn each pair of dimensions by an "
    "angle that grows with the position, and a normalised query meets a normalised key."
)
NEW_TOKENS = 32

# System prompt and two user turns (the first answered by the assistant).
CHAT_MESSAGES = {
    # gpt-oss's harmony template: the system message becomes the developer's instructions,
    # and the generated system message carries today's date (`strftime_now`), which the Rust
    # test takes from each rendering's own "Current date:" line.
    "tiny-gpt-oss": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! What do you need?"},
        {"role": "user", "content": "Name a prime."},
    ],
    "tiny-mixtral": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"},
    ],
    "tiny-qwen3-moe": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHello! What do you need?"},
        {"role": "user", "content": "Name a prime."},
    ],
    "tiny-qwen3": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHello! What do you need?"},
        {"role": "user", "content": "Name a prime."},
    ],
    # The Gemma fixture carries the fixture's ChatML template (its tokenizer has no
    # <start_of_turn>), so this records that template's rendering.
    "tiny-gemma3": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! What do you need?"},
        {"role": "user", "content": "Name a prime."},
    ],
    "tiny-mistral-swa": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"},
    ],
    "tiny-smollm3": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"},
    ],
    "tiny-gemma2": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! What do you need?"},
        {"role": "user", "content": "Name a prime."},
    ],
    "tiny-phi3": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! What do you need?"},
        {"role": "user", "content": "Name a prime."},
    ],
}
# (add_generation_prompt, extra keyword arguments) rendered for each shape.
CHAT_CASES = {
    "tiny-qwen3": [(True, {}), (True, {"enable_thinking": False}), (False, {})],
    "tiny-qwen3-moe": [(True, {}), (False, {})],
    "tiny-mixtral": [(True, {})],
    "tiny-gpt-oss": [(True, {}), (False, {}), (True, {"reasoning_effort": "high"})],
    "tiny-phi3": [(True, {}), (False, {})],
    "tiny-gemma3": [(True, {}), (False, {})],
    "tiny-gemma2": [(True, {}), (False, {})],
    "tiny-mistral-swa": [(True, {})],
    "tiny-smollm3": [(True, {})],
}


def generate_golden(shape, engram, out_path):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = tempfile.TemporaryDirectory(prefix="engram-golden-arch-")
    base, edit = EDITS.get(shape, (shape, {}))
    subprocess.run([engram, "fixture", base, "--out", tmp.name, "--formats", "f16"], check=True)
    model_dir = os.path.join(tmp.name, f"{base}-hf")
    if edit:
        cfg_path = os.path.join(model_dir, "config.json")
        with open(cfg_path, encoding="utf-8") as f:
            cfg_json = json.load(f)
        cfg_json.update(edit)
        with open(cfg_path, "w", encoding="utf-8") as f:
            json.dump(cfg_json, f, indent=2)

    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    assert type(model).__name__ == SHAPES[shape], f"transformers built {type(model).__name__}, wanted {SHAPES[shape]}"
    cfg = model.config

    ids = tok(PROMPT, add_special_tokens=True)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == PROMPT, "tokenizer does not round-trip the prompt"
    assert 200 <= len(ids) <= 600, f"prompt is {len(ids)} tokens; wanted a few hundred"

    kinds = getattr(cfg, "layer_types", None) or []
    window = getattr(cfg, "sliding_window", None) if "sliding_attention" in kinds or cfg.model_type == "mistral" else None
    if window is not None:
        assert len(ids) >= 8 * window, f"the prompt ({len(ids)} tokens) should cross the {window}-token window many times"

    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        logits = model(x).logits[0].float()
    assert logits.shape == (len(ids), cfg.vocab_size), logits.shape
    assert torch.isfinite(logits).all()
    last = logits[-1].tolist()
    argmax = logits.argmax(dim=-1).tolist()
    top2 = logits.topk(2, dim=-1).values
    min_gap = float((top2[:, 0] - top2[:, 1]).min())

    gen_cfg = copy.deepcopy(model.generation_config)
    gen_cfg.do_sample = False
    gen_cfg.eos_token_id = None
    gen_cfg.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    gen_cfg.max_new_tokens = NEW_TOKENS
    gen_cfg.min_new_tokens = None
    for k in ("temperature", "top_p", "top_k"):
        if hasattr(gen_cfg, k):
            setattr(gen_cfg, k, None)
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen_cfg)
    greedy = out[0, len(ids):].tolist()
    assert len(greedy) == NEW_TOKENS, f"generate gave {len(greedy)} tokens"

    # generate's cached path against full recomputation at every step.
    seq = list(ids)
    gaps = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            lg = model(torch.tensor([seq])).logits[0, -1]
            t2 = lg.topk(2).values
            gaps.append(float(t2[0] - t2[1]))
            seq.append(int(lg.argmax()))
    assert seq[len(ids):] == greedy, f"generate {greedy} != recomputed greedy {seq[len(ids):]}"

    messages = CHAT_MESSAGES[shape]
    chats = []
    for add_gen, kwargs in CHAT_CASES[shape]:
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_gen, **kwargs)
        chats.append({"add_generation_prompt": add_gen, "kwargs": kwargs, "rendered": rendered})

    st = os.path.join(model_dir, "model.safetensors")
    tj = os.path.join(model_dir, "tokenizer.json")
    golden = {
        "format": 1,
        "regenerate": f"cargo build --release -p engram-cli && /work/venv-torch/bin/python scripts/golden_arch.py --shape {shape}",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "model_class": type(model).__name__,
        "fixture": {
            "shape": base,
            "config_edit": edit,
            "model.safetensors": {"size": os.path.getsize(st), "sha256": sha256(st), "fnv1a64": fnv1a64(st), **safetensors_edges(st)},
            "tokenizer.json": {"size": os.path.getsize(tj), "sha256": sha256(tj), "fnv1a64": fnv1a64(tj)},
        },
        "prompt": PROMPT,
        "prompt_ids": ids,
        "vocab_size": cfg.vocab_size,
        "last_logits": [sig7(v) for v in last],
        "argmax_per_position": argmax,
        "min_top2_gap_prompt": min_gap,
        "greedy_new_tokens": NEW_TOKENS,
        "greedy_ids": greedy,
        "min_top2_gap_greedy": min(gaps),
        "sliding_window": window,
        "chat_messages": messages,
        "chat": chats,
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    size = os.path.getsize(out_path)
    print(f"wrote {out_path} ({size} bytes): {type(model).__name__}, {len(ids)} prompt tokens")
    print(f"  greedy: {greedy}")
    print(f"  smallest top-2 logit gap: prompt {min_gap:.3e}, greedy {min(gaps):.3e}")
    for c in chats:
        print(f"  chat {c['kwargs']} add_generation_prompt={c['add_generation_prompt']}: {c['rendered']!r}")
    assert size < 200_000, "golden file too large"
    tmp.cleanup()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), action="append", help="shape(s) to regenerate (default: all)")
    ap.add_argument("--engram", default=DEFAULT_ENGRAM, help="engram binary (default: target/release/engram)")
    args = ap.parse_args()
    if not os.path.exists(args.engram):
        sys.exit(f"{args.engram} not found: run `cargo build --release -p engram-cli` or pass --engram")
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    for shape in args.shape or sorted(SHAPES):
        generate_golden(shape, args.engram, os.path.join(GOLDEN_DIR, f"{shape}.json"))


if __name__ == "__main__":
    main()
