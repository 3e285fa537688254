#!/usr/bin/env bash
# Builds starling (dev preset: CPU, plus the CUDA backend when a toolkit is found) and runs the
# whole test suite, then checks that it left nothing behind: no process it started still
# running, no temporary folder (scripts/check_leftovers.sh).
# Usage: bash scripts/test.sh [preset] [ctest arguments...]   (default preset: dev)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-dev}"
shift || true
bash scripts/deps.sh
# STARLING_DEBUG_LEVEL (e.g. g1, as CI sets it): that much debug information instead of the
# presets' -g. Line tables (-g1) keep file:line in backtraces and sanitizer reports, and compile
# about a third faster than full debug information (40% under ASan) on CI's 2 cores.
extra=()
if [[ -n "${STARLING_DEBUG_LEVEL:-}" ]]; then
  extra+=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -${STARLING_DEBUG_LEVEL} -DNDEBUG"
          "-DCMAKE_CXX_FLAGS_DEBUG=-${STARLING_DEBUG_LEVEL}")
fi
cmake --preset "$preset" ${extra[@]+"${extra[@]}"} >/dev/null
cmake --build --preset "$preset"

# Everything the suite starts inherits STARLING_TEST_SUITE, which is how the check finds what
# is left; every test process makes its temporary folder under this run's own TMPDIR.
suite_id="$(date +%s)-$$-$RANDOM$RANDOM"
suite_tmp=$(mktemp -d "${TMPDIR:-/tmp}/starling_suite.XXXXXX")
trap 'rm -rf "$suite_tmp"' EXIT
rc=0
STARLING_TEST_SUITE="$suite_id" TMPDIR="$suite_tmp" ctest --preset "$preset" "$@" || rc=$?
bash scripts/check_leftovers.sh "$suite_id" "$suite_tmp" || rc=1
exit "$rc"
