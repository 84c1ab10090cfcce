#!/usr/bin/env bash
# Runs on the GPU machine (no Rust there), from the repository root, after `cargo xtask device-pack`:
#   bash .device/run.sh [tests|sanitize|bench|all] [ARGS for rgk-bench]
# tests: every test executable; sanitize: the GPU tests under compute-sanitizer memcheck and
# racecheck (fails on any report); bench: the benchmark, results to $OUT (or .device/out).
set -u
cd "$(dirname "$0")/.."
mode=${1:-all}
shift || true
out=${OUT:-.device/out}
logs=$(mktemp -d /tmp/rgk-logs.XXXX)
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
export RGK_COMMIT=$(cat .device/COMMIT 2>/dev/null || echo unknown)
fail=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true

if [ "$mode" = tests ] || [ "$mode" = all ]; then
  for t in .device/tests/*; do
    echo "=== $t"
    "$t" --test-threads=1 --nocapture >"$logs/test-$(basename "$t").log" 2>&1
    rc=$?
    grep -E "^test |test result|skipped|worst|seed" "$logs/test-$(basename "$t").log" | grep -v "^test .* ok$" | head -40
    [ $rc -eq 0 ] || { echo "FAILED: $t (rc=$rc)"; tail -30 "$logs/test-$(basename "$t").log"; fail=1; }
  done
fi

if [ "$mode" = sanitize ] || [ "$mode" = all ]; then
  for tool in memcheck racecheck; do
    for t in .device/tests/*; do
      case "$(basename "$t")" in ptx|rgk|rgk_tests|ptx_build|nvptx_link|xtask|rgk_bench) continue ;; esac
      log="$logs/sanitize-$tool-$(basename "$t").log"
      compute-sanitizer --tool "$tool" --error-exitcode 97 "$t" --test-threads=1 >"$log" 2>&1
      rc=$?
      summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1)
      echo "$tool $(basename "$t"): rc=$rc ${summary}"
      [ $rc -eq 0 ] || { fail=1; grep -E "=========" "$log" | head -20; }
    done
  done
fi

if [ "$mode" = bench ] || [ "$mode" = all ]; then
  cp bench/results/h200.json "$out/h200.json" 2>/dev/null || true
  .device/rgk-bench --out "$out/h200.json" --work-dir /tmp/rgk-bench-work "$@" 2>&1 | tee "$logs/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
  cp /tmp/rgk-bench-work/alternatives.json "$out/" 2>/dev/null || true
fi
# The device tool returns at most 8 files: logs go back as one archive.
tar czf "$out/logs.tgz" -C "$logs" . 2>/dev/null || true
echo "run.sh: $([ $fail -eq 0 ] && echo PASSED || echo FAILED)"
exit $fail
