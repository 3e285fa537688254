#!/usr/bin/env bash
# The end-of-suite check: fails, naming them, when processes started by a test suite run are
# still alive, or when its test processes left temporary folders behind.
# Usage: bash scripts/check_leftovers.sh SUITE_ID SUITE_TMP
#   SUITE_ID: the value of STARLING_TEST_SUITE in the environment of everything the suite ran
#   SUITE_TMP: the TMPDIR the suite ran under (each test process makes its own folder there and
#   removes it at exit)
# Processes still alive after a grace of STARLING_LEFTOVER_GRACE_S seconds (default 5: a child
# killed by its parent-death signal may take a moment) are named, then killed, so that a failed
# check leaves nothing running either.
set -uo pipefail
id="${1:?usage: check_leftovers.sh SUITE_ID SUITE_TMP}"
tmp="${2:?usage: check_leftovers.sh SUITE_ID SUITE_TMP}"
grace="${STARLING_LEFTOVER_GRACE_S:-5}"

suite_pids() {
  local env_file pid
  for env_file in /proc/[0-9]*/environ; do
    pid="${env_file#/proc/}"
    pid="${pid%/environ}"
    [[ "$pid" == "$$" || "$pid" == "$BASHPID" ]] && continue
    if { tr '\0' '\n' <"$env_file"; } 2>/dev/null | grep -qxF "STARLING_TEST_SUITE=$id"; then
      # Zombies are waiting for a parent's waitpid; they hold no port or memory but still count.
      echo "$pid"
    fi
  done
}

left=()
for ((i = 0; i <= grace * 10; ++i)); do
  mapfile -t left < <(suite_pids)
  ((${#left[@]} == 0)) && break
  sleep 0.1
done

failed=0
if ((${#left[@]} > 0)); then
  failed=1
  echo "check_leftovers: ${#left[@]} process(es) started by the test suite are still running:" >&2
  for pid in "${left[@]}"; do
    cmd=$({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null)
    state=$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
    echo "  pid $pid (state ${state:-?}): ${cmd:-?}" >&2
  done
  for pid in "${left[@]}"; do kill -KILL "$pid" 2>/dev/null; done
fi

if [[ -d "$tmp" ]]; then
  mapfile -t dirs < <(find "$tmp" -mindepth 1 -maxdepth 1 -printf '%p\n' 2>/dev/null | sort)
  if ((${#dirs[@]} > 0)); then
    failed=1
    echo "check_leftovers: the test suite left ${#dirs[@]} temporary path(s) behind:" >&2
    printf '  %s\n' "${dirs[@]}" >&2
  fi
fi

if ((failed)); then
  exit 1
fi
echo "check_leftovers: no process and no temporary folder of the suite left"
