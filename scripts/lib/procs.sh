# Sourced by scripts and benchmarks that start servers: `on_exit_kill_children` makes every
# exit of the calling script (success, failure under set -e, Ctrl-C, SIGTERM, SIGHUP) kill all
# processes the script started, however deep (background jobs, command substitutions and what
# they started), then run the cleanup command given, e.g.
#   source scripts/lib/procs.sh
#   on_exit_kill_children 'rm -rf "$work"'

# The pids of every descendant of process $1, deepest first, read in one pass of ps.
descendants_of() {
  ps -eo pid=,ppid= | awk -v root="$1" '
    { parent[$1] = $2; pids[NR] = $1 }
    END {
      for (i = 1; i <= NR; ++i) {
        p = pids[i]; depth = 0; q = p
        while (q in parent && q != root && q > 1) { q = parent[q]; ++depth }
        if (q == root && p != root) print depth, p
      }
    }' | sort -rn | awk '{ print $2 }'
}

# Kills the descendants of this shell (SIGTERM, then SIGKILL after a second for what is left)
# and waits for this shell's own children.
kill_children() {
  local pids
  pids=$(descendants_of $$ || true)
  [[ -z "$pids" ]] && return 0
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  for _ in $(seq 10); do
    pids=$(for p in $pids; do if kill -0 "$p" 2>/dev/null; then echo "$p"; fi; done)
    [[ -z "$pids" ]] && break
    sleep 0.1
  done
  # shellcheck disable=SC2086
  [[ -n "$pids" ]] && kill -KILL $pids 2>/dev/null || true
  wait 2>/dev/null || true
}

on_exit_kill_children() {
  _procs_cleanup="${1:-true}"
  trap 'rc=$?; trap - EXIT; kill_children; eval "$_procs_cleanup"; exit $rc' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
}
