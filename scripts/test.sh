#!/usr/bin/env bash
# Builds PyPTO and runs every test; exits non-zero if anything fails. CI runs exactly this.
#
#   1. build         Release build with warnings as errors, in build/
#   2. ctest         C++ unit tests (two shards, one per core) and the ONNX node-test
#                    conformance run (tests/conformance)
#   3. asan build    with PTO_SANITIZE=1: the same tests built with AddressSanitizer + UBSan
#                    (-O1), in build-asan/
#   4. asan ctest    ... and run
#   5. pytest        tests/python: whole models through `pto run` against onnxruntime (one
#                    worker per core)
#
# Installs what is missing first (scripts/setup.sh). The sanitizer phases are opt-in
# (PTO_SANITIZE=1; run them at least once per change to the C++): on a fresh 2-core machine they
# more than double the run (a cold build of their own of the whole library, ~20 minutes, and unit
# tests ~20x slower), and CI must stay well under 30 minutes. PTO_JOBS=N limits build parallelism.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/common.sh

bash scripts/setup.sh || { echo "test: setup failed" >&2; exit 1; }

t_start=$SECONDS
results=()
failed=0
# phase NAME COMMAND...: runs one phase, records PASS/FAIL and its time.
phase() {
  local name=$1 t0=$SECONDS rc=0
  shift
  echo
  echo "==== $name: $*"
  "$@" || rc=$?
  local status=PASS
  if [ $rc -ne 0 ]; then status="FAIL (exit $rc)"; failed=1; fi
  results+=("$(printf '%-12s %-16s %5d s' "$name" "$status" $((SECONDS - t0)))")
  return $rc
}
skip() { results+=("$(printf '%-12s %-16s' "$1" "SKIP ($2)")"); failed=1; }

# shellcheck disable=SC2317  # called through `phase`
run_pytest() {
  local rc=0 workers=()
  # One pytest worker per core (pytest-xdist): most of a test's time is single-threaded Python
  # (export, capture, compile); model exports are cached with an atomic rename, so two workers
  # may race to write one safely.
  "$PY" -c "import xdist" 2>/dev/null && workers=(-n "$(nproc)")
  PTO_BIN=$PWD/build/pto "$PY" -m pytest tests/python -p no:cacheprovider -ra "${workers[@]}" \
    </dev/null || rc=$?
  if [ "$rc" -eq 5 ]; then echo "pytest: no tests collected"; return 0; fi
  return "$rc"
}

if phase build pto_build build; then
  phase ctest ctest --test-dir build --output-on-failure -j "$(nproc)"
  built=1
else
  skip ctest "build failed"
  built=0
fi

if [ "${PTO_SANITIZE:-0}" != 1 ]; then
  results+=("$(printf '%-12s %-16s' "asan" "not run (PTO_SANITIZE=1 runs it)")")
elif phase "asan build" pto_build build-asan -DPTO_SANITIZE=ON \
    -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" -- pto_tests pto_conformance; then
  # tests/sanitizers/lsan.supp: libgomp workers' thread_local scratch at exit (see the file).
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0" \
    phase "asan ctest" ctest --test-dir build-asan --output-on-failure -j "$(nproc)"
else
  skip "asan ctest" "build failed"
fi

if [ $built = 1 ]; then
  phase pytest run_pytest
else
  skip pytest "build failed"
fi

echo
echo "==== summary"
printf '  %s\n' "${results[@]}"
[ -f build/conformance.json ] && echo "  ONNX node tests: $(cat build/conformance.json)"
total=$((SECONDS - t_start))
if [ $failed = 0 ]; then
  echo "ALL PASSED in $((total / 60)) min $((total % 60)) s"
else
  echo "FAILED (see the phases above) after $((total / 60)) min $((total % 60)) s"
fi
exit $failed
