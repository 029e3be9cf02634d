#!/usr/bin/env bash
# Mixture-of-experts decode against llama.cpp on the same GGUF files: a random-weight Qwen3-MoE
# (transformers builds it offline from a config: 12 layers, hidden 1024, 64 experts of width 512,
# 8 per token; 1.24 B weights, ~0.15 B active), converted by `engram convert`, quantized by
# llama.cpp's own quantizer (Q4_0, Q4_K_M), then scripts/yardstick.py on those files (both
# runtimes alternating, best of N; the decode limit is the measured bandwidth over the bytes
# of the weights one token reads: attention, the router and 8 of 64 experts per layer).
#
#   scripts/moe_speed.sh TORCH_VENV LLAMA_VENV DIR [yardstick.py options]
#
# TORCH_VENV has torch + transformers (>= 4.51, which knows Qwen3-MoE); LLAMA_VENV comes from
# `scripts/yardstick.sh setup`. Never needed by tests or CI.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
torch_venv=${1:?TORCH_VENV}; llama_venv=${2:?LLAMA_VENV}; dir=${3:?DIR}; shift 3
engram=${ENGRAM:-$here/../target/release/engram}
mkdir -p "$dir"
[ -d "$dir/tiny/tiny-qwen3-moe-hf" ] || "$engram" fixture tiny-qwen3-moe --out "$dir/tiny" --formats f16
if [ ! -f "$dir/moe-hf/model.safetensors" ]; then
  "$torch_venv/bin/python" - "$dir/tiny/tiny-qwen3-moe-hf" "$dir/moe-hf" <<'PY'
import json, os, shutil, sys, torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
src, out = sys.argv[1], sys.argv[2]
cfg = json.load(open(os.path.join(src, "config.json")))  # the fixture's tokenizer ids and template
cfg.pop("architectures", None)
cfg.update(hidden_size=1024, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
           num_experts=64, num_experts_per_tok=8, moe_intermediate_size=512, intermediate_size=3072, torch_dtype="float16")
torch.manual_seed(0)
m = Qwen3MoeForCausalLM(Qwen3MoeConfig(**cfg)).to(torch.float16)
m.save_pretrained(out, safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copy(os.path.join(src, f), os.path.join(out, f))
print(f"{sum(p.numel() for p in m.parameters()) / 1e6:.0f} M weights", file=sys.stderr)
PY
fi
[ -f "$dir/moe-f16.gguf" ] || "$engram" convert --model "$dir/moe-hf" --out "$dir/moe-f16.gguf" --format f16
for fmt in q4_0 q4_k_m; do
  out="$dir/moe-$fmt-lcpp.gguf"
  [ -f "$out" ] && continue
  "$llama_venv/bin/python" - "$dir/moe-f16.gguf" "$out.tmp" "$fmt" <<'PY'
import ctypes, sys, llama_cpp
ft = {"q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M}[sys.argv[3]]
p = llama_cpp.llama_model_quantize_default_params(); p.ftype = ft; p.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))
PY
  mv "$out.tmp" "$out"
done
exec "$llama_venv/bin/python" "$here/yardstick.py" --engram "$engram" \
  --file "MoE Q4_0=$dir/moe-q4_0-lcpp.gguf" --file "MoE Q4_K_M=$dir/moe-q4_k_m-lcpp.gguf" "$@"
