# Sourced by the C test scripts: a tally of named checks.
# Set `label` (the summary's prefix) and `log` (a file every line goes to) first.
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
