#!/usr/bin/env bash
# The GPU check (issue 15, docs/gpu.md), run THERE: on a lent GPU machine, in a copy of this repo
# that carries .whl/ (`make gpu-kit` fills it here). Also `make gpu-check`.
#
#   bash scripts/gpu_check.sh [--install-only] [--only tests,kernel,costs] [--site DIR] [--report DIR]
#
# 1. install: the kit's wheels into SITE with pip --target (no index, no dependency resolution),
#    and spectui mapped onto this checkout by SITE/sitecustomize.py (scripts/gpu_kit.py shim);
#    prints `export PYTHONPATH=...` and writes it to SITE/env.sh. --install-only stops here.
# 2. device and versions, 3. pytest -m cuda tests/gpu, 4. the measurements that exist
#    (kernels/bench.py, scripts/gpu_costs.py), each under a timeout within one overall budget;
#    --only runs a subset of tests, kernel and costs (two device calls when one would not fit);
# 5. REPORT/gpu-report.json (with gpu-check.log, gpu-tests.xml, kernel.json, costs.json beside it).
# Exits non-zero when the install, a test or a measurement failed (after writing the report).
#
# Environment: PYTHON (python3, else .venv/bin/python where python3 has no torch), GPU_KIT_WHEELS (.whl), GPU_CHECK_SITE (/tmp/spectui-gpu-site),
# GPU_CHECK_REPORT ($OUT, else reports/gpu), GPU_CHECK_BUDGET (570 s for steps 2-4),
# GPU_CHECK_TEST_TIMEOUT (330 s), GPU_CHECK_MEASURE_TIMEOUT (180 s each), GPU_CHECK_WORKERS (6
# pytest-xdist workers where xdist imports and CUDA is there).
set -uo pipefail

CALLER=$PWD
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
absolute() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$CALLER/$1" ;; esac; }

PYTHON=${PYTHON:-python3}
# A dev machine's python3 may lack torch: take the project's venv then (the GPU machine's has it).
if [ "$PYTHON" = python3 ] && [ -x .venv/bin/python ] &&
    ! python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' 2>/dev/null; then
    PYTHON=.venv/bin/python
fi
WHEELS=$(absolute "${GPU_KIT_WHEELS:-$ROOT/.whl}")
SITE=$(absolute "${GPU_CHECK_SITE:-/tmp/spectui-gpu-site}")
REPORT=$(absolute "${GPU_CHECK_REPORT:-${OUT:-$ROOT/reports/gpu}}")
BUDGET=${GPU_CHECK_BUDGET:-570}
TEST_TIMEOUT=${GPU_CHECK_TEST_TIMEOUT:-330}
MEASURE_TIMEOUT=${GPU_CHECK_MEASURE_TIMEOUT:-180}
INSTALL_ONLY=0
ONLY=tests,kernel,costs
while [ $# -gt 0 ]; do
    case $1 in
        --install-only) INSTALL_ONLY=1 ;;
        --only) ONLY=${2:?--only needs a list such as tests,kernel,costs}; shift ;;
        --site) SITE=$(absolute "${2:?--site needs a folder}"); shift ;;
        --report) REPORT=$(absolute "${2:?--report needs a folder}"); shift ;;
        -h|--help) sed -n '2,/^set /p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

use_site() {  # SITE first on PYTHONPATH, once
    case ":${PYTHONPATH:-}:" in
        *":$SITE:"*) ;;
        *) export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" ;;
    esac
}

install() {
    local wheels=()
    [ -d "$WHEELS" ] && wheels=("$WHEELS"/*.whl)
    if [ ${#wheels[@]} -eq 0 ] || [ ! -f "${wheels[0]}" ]; then
        echo "gpu_check: no wheels in $WHEELS: run \`make gpu-kit\` on the dev machine and carry .whl (run ... carry [\".whl\"])" >&2
        return 1
    fi
    mkdir -p "$SITE" || return 1
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --disable-pip-version-check --root-user-action=ignore --target "$SITE" "${wheels[@]}" || {
        echo "gpu_check: pip could not install the wheels of $WHEELS into $SITE (see above)" >&2
        return 1
    }
    "$PYTHON" scripts/gpu_kit.py shim "$SITE" --repo "$ROOT" || return 1
    use_site
    printf 'export PYTHONPATH=%q\n' "$PYTHONPATH" | tee "$SITE/env.sh"
}

if [ "$INSTALL_ONLY" = 1 ]; then
    install
    exit
fi

mkdir -p "$REPORT" || exit 2
LOG=$REPORT/gpu-check.log
rm -f "$LOG" "$REPORT"/{gpu-tests.xml,kernel.json,costs.json,gpu-report.json} "$SITE/gpu-env.json"
echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) in $ROOT: site $SITE, report $REPORT" | tee "$LOG"

# step NAME LIMIT CMD...: CMD under `timeout`, cut to what is left of BUDGET; output to the log.
step() {
    local name=$1 limit=$2 left=$((BUDGET - SECONDS))
    shift 2
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 10 ]; then
        echo "== $name: skipped, the budget of ${BUDGET}s is spent" | tee -a "$LOG"
        return 124
    fi
    echo "== $name (timeout ${limit}s): $*" | tee -a "$LOG"
    PYTHONUNBUFFERED=1 timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    return "${PIPESTATUS[0]}"
}

report() {
    "$PYTHON" scripts/gpu_kit.py report --dir "$REPORT" --env "$SITE/gpu-env.json" --seconds "$SECONDS" "$@" 2>&1 | tee -a "$LOG"
    exit "${PIPESTATUS[0]}"
}

if ! install 2>&1 | tee -a "$LOG"; then
    report --install "$(tail -n 1 "$LOG")"
fi
use_site  # install ran in the pipeline's subshell

step env 60 "$PYTHON" scripts/gpu_kit.py env --json "$SITE/gpu-env.json"
wanted() { case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

tests_rc=5  # pytest's "no tests ran": not a failure
if wanted tests; then
    workers=()  # with pytest-xdist and a GPU, the kernel families compile in parallel (ptxas is slow cold)
    if "$PYTHON" -c 'import sys, torch, xdist; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
        workers=(-n "${GPU_CHECK_WORKERS:-6}")
    fi
    step tests "$TEST_TIMEOUT" "$PYTHON" -m pytest -q -rP -m cuda tests/gpu -p no:cacheprovider "${workers[@]}" \
        --junitxml "$REPORT/gpu-tests.xml"
    tests_rc=$?
fi

measure() {  # measure NAME FILE CMD...: run CMD when FILE is in this checkout, else record it absent
    local name=$1 file=$2 rc
    shift 2
    wanted "$name" || return 0
    if [ -f "$file" ]; then
        step "$name" "$MEASURE_TIMEOUT" "$@"
        rc=$?
    else
        echo "== $name: $file is not in this checkout, not measured" | tee -a "$LOG"
        rc=absent
    fi
    steps+=(--step "$name:$rc:$REPORT/$name.json")
}
steps=()
measure kernel kernels/bench.py "$PYTHON" -m spectui.kernels.bench --sweep --json "$REPORT/kernel.json"
measure costs scripts/gpu_costs.py "$PYTHON" scripts/gpu_costs.py --json "$REPORT/costs.json"

report --tests "$tests_rc" "${steps[@]}"
