#!/usr/bin/env bash
# Engram against llama.cpp on the same files, on this machine: the speed table in docs/benchmarks.md.
#
#   scripts/yardstick.sh setup VENV          build llama-cpp-python into VENV (outside the repo),
#                                            SIMD flags picked from /proc/cpuinfo (~6-10 min on 2 cores)
#   scripts/yardstick.sh run VENV FIXDIR [yardstick.py options]
#                                            writes llama.cpp-quantized files from FIXDIR/llama-1b-f16.gguf
#                                            (FIXDIR/llama-1b-<fmt>-lcpp.gguf; with --only, those formats'
#                                            only), then runs scripts/yardstick.py
#                                            with VENV's python: Engram and llama.cpp alternating, best of 3
#   scripts/yardstick.sh files VENV FIXDIR [--only FMTS]
#                                            writes those files only (e.g. for scripts/yardstick_cpu.py)
#
# FIXDIR comes from `engram fixture llama-1b --out FIXDIR --formats f16,q8_0,q4_0,q4_k_m`.
# Never needed by tests or CI.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}; venv=${2:-}
[ -n "$cmd" ] && [ -n "$venv" ] || { sed -n 2,16p "$0"; exit 2; }

# CMake flags for ggml's CPU backend from what this CPU has. AMX stays off everywhere: its
# path stops with SIGILL on some machines that list the flags; AVX-512 only where present
# (on an AVX2-only CPU an AVX-512 build dies with SIGILL).
cpu_flags() {
  local f; f=$(grep -m1 '^flags' /proc/cpuinfo || true)
  has() { [[ " $f " == *" $1 "* ]] && echo ON || echo OFF; }
  echo "-DGGML_NATIVE=OFF -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma) -DGGML_F16C=$(has f16c)" \
       "-DGGML_AVX512=$(has avx512f) -DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_VBMI=$(has avx512vbmi)" \
       "-DGGML_AVX512_BF16=$(has avx512_bf16) -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
}

case $cmd in
  setup)
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q cmake ninja scikit-build-core numpy
    mkdir -p "$venv/tmp"
    echo "CMAKE_ARGS=$(cpu_flags)"
    # The build's own tools from the venv (no isolated build env in /tmp that a cleaner may remove).
    TMPDIR="$venv/tmp" CMAKE_ARGS="$(cpu_flags)" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) PATH="$venv/bin:$PATH" \
      nice -n 10 "$venv/bin/pip" install --no-build-isolation --no-cache-dir -q llama-cpp-python
    "$venv/bin/python" -c 'import llama_cpp; print("llama-cpp-python", llama_cpp.__version__, "ready")' ;;
  run|files)
    fixdir=${3:?FIXDIR}; shift 3
    f16="$fixdir/llama-1b-f16.gguf"
    [ -f "$f16" ] || { echo "$f16 missing: engram fixture llama-1b --out $fixdir --formats f16,q8_0,q4_0,q4_k_m" >&2; exit 2; }
    # With --only, write just the files of the formats asked for (F16 needs none).
    only=""; prev=""
    for a in "$@"; do
      case $a in --only=*) only=${a#--only=} ;; esac
      [ "$prev" = --only ] && only=$a
      prev=$a
    done
    only=",$(echo "$only" | tr 'A-Z' 'a-z' | tr -d ' '),"
    for fmt in q4_0 q8_0 q4_k_m q4_1 q5_k_m q6_k q3_k_m iq4_xs q5_0 q5_1 q2_k iq4_nl bf16 iq3_xxs iq3_s iq3_m; do
      out="$fixdir/llama-1b-$fmt-lcpp.gguf"
      [ -f "$out" ] && continue
      [ "$only" != ",," ] && [[ $only != *",$fmt,"* ]] && continue
      echo "llama.cpp quantizer: $f16 -> $out" >&2
      "$venv/bin/python" - "$f16" "$out.tmp" "$fmt" <<'PY'
import ctypes, sys, llama_cpp
ft = {"q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
      "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, "q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1,
      "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M, "q6_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
      "q3_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M, "iq4_xs": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS,
      "q5_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_0, "q5_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_1,
      "q2_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K, "iq4_nl": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL,
      "bf16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16, "iq3_xxs": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ3_XXS,
      "iq3_s": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ3_S, "iq3_m": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ3_M}[sys.argv[3]]
p = llama_cpp.llama_model_quantize_default_params(); p.ftype = ft; p.nthread = 2
# IQ3_XXS's default mix puts IQ2_S (which needs an importance matrix) on attn_k: every tensor IQ3_XXS instead.
p.pure = sys.argv[3] == "iq3_xxs"
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))
PY
      mv "$out.tmp" "$out"
    done
    [ "$cmd" = files ] && exit 0
    exec "$venv/bin/python" "$here/yardstick.py" --fixture-dir "$fixdir" "$@" ;;
  *) sed -n 2,16p "$0"; exit 2 ;;
esac
