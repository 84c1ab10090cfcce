#!/usr/bin/env bash
# Runs on the GPU machine (no Rust there), from the repository root, after `cargo xtask device-pack`:
#   bash .device/run.sh [tests|sanitize|python|bench|all|ab] [ARGS for rgk-bench]
#   bash .device/run.sh abn "ORDER" [ARGS for rgk-bench]   (ORDER: build tags, e.g. "cur E E cur";
#                                                          ab is abn "base cur cur base")
#   bash .device/run.sh profile EXECUTABLE TEST KERNEL_REGEX [LAUNCHES]
#   bash .device/run.sh source EXECUTABLE TEST KERNEL_REGEX [SKIP]
#   bash .device/run.sh peer-profile WORKLOAD [CALLS]   (ours and the peers' kernels after the bench's flush)
# tests: every test executable; sanitize: the sanitizer set under compute-sanitizer memcheck,
# racecheck, synccheck and initcheck (fails on any report); python: the rgk Python package's
# tests (python/tests) on the GPU; bench: the benchmark, one process per op (a failing op cannot
# take the others down), rows merged into $OUT/h200.json. profile: Nsight Compute on one test
# of a test executable (the bench cannot be profiled: its own CUPTI subscriber excludes ncu),
# the kernels matching KERNEL_REGEX, caches flushed, clocks unlocked, the launch, speed-of-light,
# occupancy, warp-state and scheduler sections as text in $OUT/profile.txt. source: one launch
# (after SKIP matching ones) with warp-state samples every 32 cycles, its SASS with
# per-instruction counts and stall samples as $OUT/source.csv and the details as
# $OUT/source.txt (summarise with `python3 xtask/sass_hotspots.py source.csv`).
# Logs go straight to $OUT (tests.log, sanitize.log, bench.log), so a run cut short still returns them.
# The bench's Python alternatives include TileOPs when .device/peers.tar.xz (cargo xtask peers)
# is there: it is unpacked into a temporary site on PYTHONPATH, with nvcc on PATH for its JIT.
# Knobs: RGK_TEST_TIMEOUT (s per test executable, default 300), RGK_BENCH_TIMEOUT (s per op,
# default 600), RGK_BENCH_OPS (default: every op), RGK_TESTS (default: every test executable),
# RGK_SANITIZE_LIST (default: tests/sanitize.list), RGK_BENCH_TAG (bench: the build of a
# device-pack --variant tag instead of cur, its rows labelled with its spec; without the
# rgk-torch column, whose wheel is cur's), RGK_PEER_METRICS (peer-profile: only these
# comma-separated ncu metrics, no sections or samples), RGK_PEER_OP (peer-profile: the row's op,
# default FFTC2CFwd), RGK_PEER_IMPLS (peer-profile: the implementations by their bench names,
# default rgk-torch,tileops; e.g. rgk-torch,tileops,torch-compile).
set -u
cd "$(dirname "$0")/.."
mode=${1:-all}
shift || true
out=${OUT:-.device/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
export RGK_COMMIT=$(cat .device/COMMIT 2>/dev/null || echo unknown)
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# Where the build had no ptxas the driver JIT-compiles the PTX module at load: let its cache
# keep the result for the next process.
export CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}
fail=0
# Unpacks the tar(.xz) $1 into the folder $2.
untar() {
  python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$2"
}
# device-pack ships the test executables as one xz tarball (they share the embedded PTX).
if [ -f .device/tests.tar.xz ] && [ ! -d .device/tests ]; then
  untar .device/tests.tar.xz .device
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true
tests=${RGK_TESTS:-$(ls .device/tests 2>/dev/null)}
case $mode in
  tests|sanitize|all)
    if [ -z "$tests" ]; then
      echo "run.sh $mode: no test executables in .device (a pack made with --bench-only?)"; exit 2
    fi ;;
esac

if [ "$mode" = tests ] || [ "$mode" = all ]; then
  for name in $tests; do
    t=.device/tests/$name
    echo "=== $name" >>"$out/tests.log"
    start=$(date +%s)
    timeout "${RGK_TEST_TIMEOUT:-300}" "$t" --nocapture >>"$out/tests.log" 2>&1
    rc=$?
    echo "$name: rc=$rc ($(( $(date +%s) - start )) s) $(grep -a "test result" "$out/tests.log" | tail -1)"
    [ $rc -eq 0 ] || fail=1
  done
  grep -a -E "panicked|FAILED|failures:" "$out/tests.log" | head -40
fi

if [ "$mode" = sanitize ] || [ "$mode" = all ]; then
  # The sanitizer set (tests/sanitize.list: each op's seed workloads and edge shapes, as lines
  # `EXECUTABLE TEST [TEST...]`, one process per line) under all four tools; any report fails.
  list=${RGK_SANITIZE_LIST:-tests/sanitize.list}  # relative to the repository root
  if [ ! -r "$list" ]; then
    echo "sanitize: cannot read $list"; fail=1; list=/dev/null
  fi
  for tool in memcheck racecheck synccheck initcheck; do
    start=$(date +%s)
    tool_fail=0
    ntests=0
    while read -r exe names; do
      case "$exe" in ''|'#'*) continue ;; esac
      n=$(echo $names | wc -w)
      ntests=$((ntests + n))
      echo "=== $tool $exe $names" >>"$out/sanitize.log"
      # shellcheck disable=SC2086
      timeout "${RGK_TEST_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 97 \
        ".device/tests/$exe" --exact --test-threads 1 $names >>"$out/sanitize.log" 2>&1
      rc=$?
      summary=$(grep -a -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitize.log" | tail -1)
      ran=$(grep -a "test result" "$out/sanitize.log" | tail -1 | grep -o "[0-9]* passed")
      if [ $rc -ne 0 ] || [ "$ran" != "$n passed" ]; then
        echo "$tool $exe: rc=$rc ($ran of $n) $summary"
        tool_fail=1
      fi
    done < "$list"
    [ $ntests -gt 0 ] || tool_fail=1
    echo "$tool: $([ $tool_fail -eq 0 ] && echo "0 reports" || echo FAILED) over $ntests tests ($(( $(date +%s) - start )) s)"
    [ $tool_fail -eq 0 ] || fail=1
  done
fi

if [ "$mode" = python ] || [ "$mode" = all ]; then
  # The rgk Python package: its wheel and pytest installed into a temporary site (the
  # machine's own torch stays), python/tests run from outside the source tree.
  if ls .device/wheels/rgk-*.whl >/dev/null 2>&1; then
    site=$(mktemp -d "${TMPDIR:-/tmp}/rgk-site.XXXXXX")
    python3 -m pip install --quiet --no-deps --no-index --target "$site" .device/wheels/*.whl
    start=$(date +%s)
    (cd "$site" && PYTHONPATH=$site timeout "${RGK_TEST_TIMEOUT:-600}" python3 -m pytest -q -p no:cacheprovider \
      --tb=short -rs "$OLDPWD/python/tests") >"$out/python.log" 2>&1
    rc=$?
    echo "python: rc=$rc ($(( $(date +%s) - start )) s) $(tail -1 "$out/python.log")"
    [ $rc -eq 0 ] || { fail=1; grep -a -E "^(FAILED|ERROR)|Error" "$out/python.log" | head -30; }
    # Host time per eager call and its parts (python/overhead.py).
    (cd "$site" && PYTHONPATH=$site timeout 120 python3 -P "$OLDPWD/python/overhead.py") 2>&1 | tee -a "$out/python.log"
  else
    echo "python: no .device/wheels (cargo xtask device-pack with ./x setup's target/pyenv)"; fail=1
  fi
fi

# TileOPs (.device/peers.tar.xz) and our wheel on PYTHONPATH, each in a fresh temporary folder.
python_path_with_peers() {
  if [ -f .device/peers.tar.xz ]; then
    # A fresh folder per run: never a half-extracted or older pack.
    peers=$(mktemp -d "${TMPDIR:-/tmp}/rgk-peers.XXXXXX")
    if untar .device/peers.tar.xz "$peers"; then
      export PYTHONPATH=$peers/site${PYTHONPATH:+:$PYTHONPATH}
    else
      echo "tileops: unpacking .device/peers.tar.xz failed; the bench runs without it"
    fi
  else
    echo "tileops: no .device/peers.tar.xz (run cargo xtask peers before device-pack); the bench runs without it"
  fi
  # Our own Python package for the rgk-torch column (cur's kernels: not beside a variant's).
  if [ "$bench_exe" != .device/rgk-bench ]; then
    echo "bench: variant ${RGK_BENCH_TAG}: no rgk-torch column (the wheel has cur's kernels)"
  elif ls .device/wheels/rgk-*.whl >/dev/null 2>&1; then
    rgk_site=$(mktemp -d "${TMPDIR:-/tmp}/rgk-wheel.XXXXXX")
    python3 -m pip install --quiet --no-deps --no-index --target "$rgk_site" .device/wheels/rgk-*.whl \
      && export PYTHONPATH=$rgk_site${PYTHONPATH:+:$PYTHONPATH}
  fi
}

# The variants' binaries (device-pack --variant), unpacked once.
unpack_variants() {
  if [ -f .device/variants.tar.xz ] && [ ! -d .device/variants ]; then
    untar .device/variants.tar.xz .device
  fi
}

bench_exe=.device/rgk-bench
if [ "${RGK_BENCH_TAG:-cur}" != cur ]; then
  if [ "$mode" != bench ]; then
    echo "run.sh $mode: RGK_BENCH_TAG applies to run.sh bench only"; exit 2
  fi
  unpack_variants
  bench_exe=.device/variants/$RGK_BENCH_TAG
  spec=$(grep -E "^$RGK_BENCH_TAG " .device/variants.txt 2>/dev/null | cut -d' ' -f2-)
  if ! echo "$RGK_BENCH_TAG" | grep -qE '^[A-Za-z0-9_-]+$' || [ ! -x "$bench_exe" ] || [ -z "$spec" ]; then
    echo "bench: no build for RGK_BENCH_TAG=$RGK_BENCH_TAG (one of: $(ls .device/variants 2>/dev/null | tr '\n' ' '))"; exit 2
  fi
  # The rows' commit: the variant's revision and patches (`70ff399abcde+a.diff+b.diff`).
  RGK_COMMIT=$(echo "$spec" | sed 's/ + /+/g')
  export RGK_COMMIT
  echo "bench: variant $RGK_BENCH_TAG = $spec"
fi

if [ "$mode" = bench ] || [ "$mode" = all ]; then
  python_path_with_peers
  [ -f "$out/h200.json" ] || cp bench/results/h200.json "$out/h200.json" 2>/dev/null || true
  for op in ${RGK_BENCH_OPS:-FFTC2CFwd MHCPreFwd MHCPostFwd MHCPostPreFwd EngramGateConvFwd EngramGateConvBwd EngramDecodeFwd}; do
    echo "=== $op" >>"$out/bench.log"
    start=$(date +%s)
    timeout "${RGK_BENCH_TIMEOUT:-600}" "$bench_exe" --op "$op" --out "$out/h200.json" --work-dir "/tmp/rgk-bench-$op" "$@" >>"$out/bench.log" 2>&1
    rc=$?
    echo "bench $op: rc=$rc ($(( $(date +%s) - start )) s)"
    [ $rc -eq 0 ] || fail=1
  done
  grep -a -E "^(│|┌|└|╞)" "$out/bench.log" | cut -c1-200
fi
if [ "$mode" = profile ]; then
  if [ $# -lt 3 ]; then
    echo "profile: bash .device/run.sh profile EXECUTABLE TEST KERNEL_REGEX [LAUNCHES]"; exit 2
  fi
  start=$(date +%s)
  timeout "${RGK_TEST_TIMEOUT:-300}" ncu --clock-control none --cache-control all \
    --kernel-name "regex:$3" --launch-count "${4:-10}" \
    --section LaunchStats --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section SchedulerStats ".device/tests/$1" --exact "$2" --test-threads 1 >"$out/profile.txt" 2>&1
  rc=$?
  echo "profile $1 $2: rc=$rc ($(( $(date +%s) - start )) s), $(grep -a -c -E "^  [a-z_0-9]+ \(.*Context" "$out/profile.txt") launches"
  grep -a -E "^  [a-z_0-9]+ \(|Duration|Warp Cycles Per Issued" "$out/profile.txt" | head -60
  [ $rc -eq 0 ] || fail=1
fi

if [ "$mode" = source ]; then
  if [ $# -lt 3 ]; then
    echo "source: bash .device/run.sh source EXECUTABLE TEST KERNEL_REGEX [SKIP]"; exit 2
  fi
  start=$(date +%s)
  rep=$(mktemp -d "${TMPDIR:-/tmp}/rgk-ncu.XXXXXX")/source
  timeout "${RGK_TEST_TIMEOUT:-300}" ncu --clock-control none --cache-control all \
    --kernel-name "regex:$3" --launch-skip "${4:-0}" --launch-count 1 --warp-sampling-interval 0 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats \
    -o "$rep" -f ".device/tests/$1" --exact "$2" --test-threads 1 >"$out/source.log" 2>&1
  rc=$?
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$out/source.csv" 2>&1
  ncu -i "$rep.ncu-rep" --page details --print-details all >"$out/source.txt" 2>&1
  echo "source $1 $2: rc=$rc ($(( $(date +%s) - start )) s)"
  grep -a -E "^  [a-z_0-9]+ \(|Duration" "$out/source.txt" | head -4
  [ $rc -eq 0 ] || fail=1
fi

if [ "$mode" = peer-profile ]; then
  # Our kernels and the alternatives' (RGK_PEER_IMPLS) on the bench's own inputs in one process,
  # each call after the bench's own flush (bench/peer_profile.py), under Nsight Compute with
  # application replay and no cache control (each replay pass is a new process, ≈ 18 s: the full
  # SourceCounters section took more than 14 passes, so only the sampled stall reasons and
  # per-instruction counts are collected): warp states and the SASS source page of every
  # profiled kernel, in $out/peer-profile.txt (details), $out/peer-source-N.csv and the
  # per-kernel summary.
  if [ $# -lt 1 ]; then
    echo "peer-profile: bash .device/run.sh peer-profile WORKLOAD [CALLS] (RGK_PEER_OP, RGK_PEER_IMPLS; rgk-bench --list names the rows)"; exit 2
  fi
  python_path_with_peers
  peer_op=${RGK_PEER_OP:-FFTC2CFwd}
  # The inputs: the bench writes them (and the f64 references) before it times anything; its
  # --workload filter takes the row's name without a -DTYPE suffix.
  peer_work=$(mktemp -d "${TMPDIR:-/tmp}/rgk-peer-inputs.XXXXXX")
  peer_row=$(printf '%s' "$1" | sed -E 's/-(c64|c128|bf16|f16)$//')
  if ! .device/rgk-bench --op "$peer_op" --workload "$peer_row" --no-alternatives --min-calls 1 \
      --max-calls 1 --budget-s 0.01 --out "$peer_work/bench.json" --work-dir "$peer_work" \
      >"$out/peer-inputs.log" 2>&1; then
    echo "peer-profile: the bench could not write the inputs of $peer_op $1:"; tail -5 "$out/peer-inputs.log"; exit 2
  fi
  start=$(date +%s)
  rep=$(mktemp -d "${TMPDIR:-/tmp}/rgk-ncu.XXXXXX")/peer
  if [ -n "${RGK_PEER_METRICS:-}" ]; then
    # Only the named metrics (e.g. DRAM and L2 sector counts), no sections or samples.
    what=(--metrics "gpu__time_duration.sum,$RGK_PEER_METRICS")
  else
    what=(--warp-sampling-interval 0 --section WarpStateStats --section LaunchStats \
      --metrics "gpu__time_duration.sum,inst_executed,smsp__pcsamp_sample_count,$(for r in barrier branch_resolving \
      dispatch_stall drain imc_miss lg_throttle long_scoreboard math_pipe_throttle membar mio_throttle misc \
      no_instructions not_selected selected short_scoreboard sleeping tex_throttle wait; do
      printf 'smsp__pcsamp_warps_issue_stalled_%s,' $r; done | sed 's/,$//')")
  fi
  timeout "${RGK_TEST_TIMEOUT:-300}" ncu --replay-mode application --cache-control none --clock-control none \
    --nvtx --nvtx-include "profiled/" "${what[@]}" \
    -o "$rep" -f python3 bench/peer_profile.py --manifest "$peer_work/manifest.json" --op "$peer_op" \
    --workload "$1" --impl "${RGK_PEER_IMPLS:-rgk-torch,tileops}" --calls "${2:-1}" >"$out/peer-profile.log" 2>&1
  rc=$?
  echo "peer-profile $peer_op $1: rc=$rc ($(( $(date +%s) - start )) s)"
  tail -5 "$out/peer-profile.log"
  ncu -i "$rep.ncu-rep" --page details --print-details all >"$out/peer-profile.txt" 2>&1
  pm=${RGK_PEER_METRICS:-}; pm=${pm//,/|}
  grep -a -E "^  [A-Za-z_0-9:<>, ]+\(|Duration|Registers Per|Warp Cycles Per Issued|Executed Instructions  |${pm:-^$}" "$out/peer-profile.txt" | head -60
  # One source page per profiled kernel (ncu prints them one after another).
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$out/peer-source.csv" 2>&1
  python3 - "$out/peer-source.csv" "$out" <<'PY'
import sys
lines = open(sys.argv[1], errors="replace").read().split("\n")
starts = [i for i, l in enumerate(lines) if l.startswith('"Address"')] + [len(lines)]
for n, (a, b) in enumerate(zip(starts, starts[1:])):
    head = lines[a - 1] if a > 0 and not lines[a - 1].startswith('"') else f"kernel {n}"
    with open(f"{sys.argv[2]}/peer-source-{n}.csv", "w") as f:
        f.write(head + "\n" + "\n".join(l for l in lines[a:b] if l.startswith('"')) + "\n")
    print(f"peer-source-{n}.csv: {head.strip()[:100]}")
PY
  for f in "$out"/peer-source-*.csv; do
    echo "== $f"; python3 xtask/sass_hotspots.py "$f" 40 2>&1 | head -60
  done
  [ $rc -eq 0 ] || fail=1
fi

if [ "$mode" = ab ]; then
  # The bench built at a base commit (.device/base-rgk-bench, `cargo xtask device-pack --base
  # REV`) against this one, A B B A: abn "base cur cur base" (below).
  if [ ! -x .device/base-rgk-bench ]; then
    echo "ab: no .device/base-rgk-bench (cargo xtask device-pack --base REV)"; exit 2
  fi
  mode=abn
  set -- "base cur cur base" "$@"
fi
if [ "$mode" = abn ]; then
  # Any number of bench builds in a given order (`device-pack --variant TAG=SPEC`): ORDER names
  # them, `cur` being .device/rgk-bench and `base` .device/base-rgk-bench, e.g. "cur D E E D cur";
  # each run --no-alternatives on the same inputs into $OUT/abn/NN-TAG.{json,log} (the folder
  # emptied first, archived at the end as $OUT/abn-runs.tar.gz); the table (times per tag in
  # run order, errors, output digests against the first tag with digests, rows that failed
  # verification) goes to abn.md. A run whose outputs fail verification (the bench's exit 3: a
  # diagnostic with wrong outputs) keeps its rows, and fails the call only for cur and base;
  # any other failure drops them and fails the call.
  order=${1:-}
  [ $# -gt 0 ] && shift
  if [ -z "$(echo $order)" ]; then
    echo "abn: bash .device/run.sh abn \"ORDER\" [BENCH ARGS] (ORDER: tags in quotes, e.g. \"cur E E cur\")"; exit 2
  fi
  unpack_variants
  # The build a tag names.
  abn_exe() {
    case $1 in
      cur) echo .device/rgk-bench ;;
      base) echo .device/base-rgk-bench ;;
      *) echo ".device/variants/$1" ;;
    esac
  }
  # Every tag is checked before the first run.
  for t in $order; do
    exe=$(abn_exe "$t")
    if ! echo "$t" | grep -qE '^[A-Za-z0-9_-]+$' || [ ! -x "$exe" ]; then
      echo "abn: no build for tag '$t' (cur, base or one of: $(ls .device/variants 2>/dev/null | tr '\n' ' '))"; exit 2
    fi
  done
  rm -rf "$out/abn" "$out/abn-runs.tar.gz"
  mkdir -p "$out/abn"
  i=0
  for t in $order; do
    i=$((i + 1))
    n=$(printf "%02d" $i)
    "$(abn_exe "$t")" --no-alternatives --out "$out/abn/$n-$t.json" --work-dir "/tmp/rgk-abn-$n" "$@" >"$out/abn/$n-$t.log" 2>&1
    rc=$?
    echo "abn $n $t: rc=$rc"
    if [ $rc -eq 3 ] && [ -f "$out/abn/$n-$t.json" ]; then
      # Timed, and some outputs failed verification (a diagnostic build's, by design): its
      # rows stay, marked in the table; for cur and base (a refactor's check) it fails the call.
      echo "abn $n $t: outputs failed verification (rows kept, marked)"
      case $t in cur|base) fail=1 ;; esac
    elif [ $rc -ne 0 ]; then
      fail=1
      tail -1 "$out/abn/$n-$t.log"
      rm -f "$out/abn/$n-$t.json"
    fi
  done
  python3 bench/ab_compare.py --runs "$out/abn" | tee "$out/abn.md"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
  # The runs' files as one archive beside the table (a remote runner may return only a few
  # files per call: two per run would crowd out the rest of the call's results).
  if tar czf "$out/abn-runs.tar.gz" -C "$out" abn; then rm -rf "$out/abn"; else fail=1; fi
fi
echo "run.sh: $([ $fail -eq 0 ] && echo PASSED || echo FAILED)"
exit $fail
