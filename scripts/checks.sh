# Sourced by the checked test scripts (C, C++, C on etcd, alerts, dist)
# right after their `cd` to the repository root, with their arguments: a
# tally of named checks. `root` is that root; `log` the script's first
# argument (a file every line goes to, made absolute; /dev/null without
# one). Set `label` (the summary's prefix) before the first step.
root=$PWD
log=${1:-/dev/null}
[[ $log = /* || $log = /dev/null ]] || log="$root/$log"

# with_scratch [CLEANUP]: `work`, a new scratch folder, removed at exit
# (after CLEANUP, a command line of the script's own, if given).
with_scratch() {
  work=$(mktemp -d)
  # shellcheck disable=SC2064 # expanded now: CLEANUP's own $ are quoted
  trap "${1:+$1; }rm -rf \"\$work\"" EXIT
}

passed=0
failed=0
failures=()

# step NAME COMMAND...: runs one check, output to the terminal and the log.
step() {
  local name=$1
  shift
  printf '\n==> %s: %s\n' "$label" "$name" | tee -a "$log"
  if "$@" 2>&1 | tee -a "$log"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failures+=("$name")
    printf '%s: FAILED: %s\n' "$label" "$name" | tee -a "$log"
  fi
}

# summary: prints `LABEL: N passed, N failed` and exits 1 on any failure.
summary() {
  printf '\n%s: %d passed, %d failed\n' "$label" "$passed" "$failed" | tee -a "$log"
  if ((failed)); then
    printf '%s: failed: %s\n' "$label" "${failures[@]}" | tee -a "$log"
    exit 1
  fi
  exit 0
}
