#!/bin/bash
# The whole pycode-long run in one go on a GPU machine (one H100 here):
# prep from this machine's Python sources -> train for a wall-clock budget ->
# export the HF folder -> held-out context eval + greedy samples.
# Results go to $OUT (log.txt, prep.json, eval.json, config.json, files.tsv.gz and
# model.safetensors in two parts: cat model.safetensors.part* > model.safetensors).
# Deadlines are counted from the script's start so that it ends well inside a
# 575 s limit: prep <= 75 s, training until +440 s, eval until +510 s.
# Usage (repository root): bash models/pycode-long/recipe/run_device.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
T0=$(date +%s)
R=models/pycode-long/recipe
W=${WORK:-/tmp/pycode-long}
OUT=${OUT:-$W/out}
TRAIN_END=${TRAIN_END:-440}
EVAL_END=${EVAL_END:-510}
mkdir -p "$W/data" "$W/export" "$OUT"
LOG=$OUT/log.txt
el() { echo $(( $(date +%s) - T0 )); }
{
  echo "# $(date -u +%FT%TZ) $(hostname) $(nproc) cores"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import sys, torch, transformers, tokenizers; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
} 2>&1 | tee -a "$LOG"

echo "## prep (t=$(el)s)" | tee -a "$LOG"
python3 $R/prep.py --out "$W/data" --time-limit 75 ${PREP_ARGS:-} 2>&1 | tee -a "$LOG" || { echo "prep failed"; exit 1; }
cp "$W/data/prep.json" "$OUT/"
gzip -c "$W/data/files.tsv" > "$OUT/files.tsv.gz"

BUDGET=$(( TRAIN_END - $(el) - 15 ))   # 15 s: CUDA start, data upload, first step
[ "$BUDGET" -lt 60 ] && BUDGET=60
echo "## train, budget ${BUDGET}s (t=$(el)s)" | tee -a "$LOG"
python3 $R/train.py --data "$W/data" --export "$W/export" --log "$W/train.jsonl" --budget "$BUDGET" ${TRAIN_ARGS:-} 2>&1 | tee -a "$LOG"
cp "$W/export/config.json" "$OUT/" 2>/dev/null
if [ -f "$W/export/model.safetensors" ]; then
  python3 - "$W/export/model.safetensors" "$OUT" <<'EOF'
import sys, os, hashlib
b = open(sys.argv[1], 'rb').read(); h = (len(b) + 1) // 2
for i, part in enumerate((b[:h], b[h:])):
    open(os.path.join(sys.argv[2], f'model.safetensors.part{i}'), 'wb').write(part)
print('weights', len(b), 'bytes, sha256', hashlib.sha256(b).hexdigest())
EOF
fi 2>&1 | tee -a "$LOG"

echo "## eval (t=$(el)s)" | tee -a "$LOG"
python3 $R/eval_context.py --model "$W/export" --data "$W/data" --device cuda --windows 64 --per-unit 8 \
  --time-limit $(( EVAL_END - $(el) - 20 > 30 ? EVAL_END - $(el) - 20 : 30 )) --out "$OUT/eval.json" \
  --sample "def parse_args(" "class LinkedList:" "import numpy as np
" ${EVAL_ARGS:-} 2>&1 | tee -a "$LOG"
echo "## done (t=$(el)s)" | tee -a "$LOG"
