#!/usr/bin/env bash
# The alert rules and the dashboard that dlock ships (issue 31): `promtool
# check rules` on packaging/prometheus/dlock-alerts.yml, its unit tests
# (packaging/prometheus/dlock-alerts.test.yml, one step per test group: each
# rule fires in one and stays quiet in another, and every rule has both),
# the dashboard checker (scripts/check-dashboards.py: Grafana's fields, and
# only the families of core/tests/fixtures/metric-families.txt in any
# expression), the dashboard's expressions parsed by promtool, and the
# checker failing on a bad name or label. Seconds; no build.
#
# Installs promtool if missing (Debian's prometheus package, without its
# recommends), and leaves the Prometheus server it brings stopped and
# disabled: only promtool is used.
#
# Prints `alerts: N passed, N failed`; fails on any failure.
# Usage: scripts/test-alerts.sh [LOGFILE]   (every step's output is appended to it)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/checks.sh
label=alerts
with_scratch
. scripts/lib.sh

rules=packaging/prometheus/dlock-alerts.yml
tests=packaging/prometheus/dlock-alerts.test.yml
dashboard=packaging/grafana/dlock-dashboard.json

# --- promtool ----------------------------------------------------------------
if ! command -v promtool >/dev/null; then
  # Only promtool: no node exporter and its timers (the package's recommends).
  printf 'APT::Install-Recommends "false";\n' >"$work/apt.conf"
  APT_CONFIG=$work/apt.conf need_debs promtool=prometheus || { echo "alerts: 0 passed, 1 failed"; exit 1; }
  # The package enables its server (and starts it where services may
  # start): this script wants the tool, not a server.
  if command -v systemctl >/dev/null; then
    systemctl disable --now prometheus.service >/dev/null 2>&1 ||
      systemctl disable prometheus.service >/dev/null 2>&1 || true
  fi
  if pid=$(pidof prometheus 2>/dev/null) && [[ -e /etc/init.d/prometheus ]]; then
    /etc/init.d/prometheus stop >/dev/null 2>&1 || echo "(the prometheus server the package started, pid $pid, is still running)" >&2
  fi
fi
command -v promtool >/dev/null || { echo "alerts: 0 passed, 1 failed"; exit 1; }

# --- the rules ---------------------------------------------------------------
step "promtool check rules $rules" promtool check rules "$rules"
step "$tests as shipped (promtool test rules, beside the rules)" promtool test rules "$tests"

# The test groups, one file each (the rules file by its absolute path), and
# the coverage: every alert of the rules file has a group where it fires
# and one where it stays quiet.
python3 - "$root/$rules" "$tests" "$work/groups" >"$work/groups.txt" <<'EOF' || { echo "cannot split $tests" >&2; }
import os, re, sys
rules, tests, out = sys.argv[1:]
os.makedirs(out)
text = open(tests, encoding="utf-8").read()
head, sep, body = text.partition("\ntests:\n")
assert sep, "no `tests:` list"
head = re.sub(r"rule_files:\n(\s+- .*\n)+", f"rule_files:\n  - {rules}\n", head + "\n")
parts = re.split(r"^  # test: (.+)\n", body, flags=re.M)
for i, (name, chunk) in enumerate(zip(parts[1::2], parts[2::2])):
    path = os.path.join(out, f"{i:02d}.yml")
    open(path, "w", encoding="utf-8").write(f"{head}tests:\n  # test: {name}\n{chunk}")
    print(f"{path}\t{name}")
EOF
coverage() {
  local alert missing=0
  for alert in $(sed -n 's/^ *- alert: *//p' "$rules"); do
    for kind in fires quiet; do
      cut -f2 "$work/groups.txt" | grep -qxF -- "$alert $kind" ||
        { echo "no test group '# test: $alert $kind' in $tests"; missing=1; }
    done
  done
  [[ -s $work/groups.txt ]] || { echo "no test group read from $tests"; missing=1; }
  ((missing == 0)) && echo "every rule: a group where it fires, one where it stays quiet ($(wc -l <"$work/groups.txt") groups)"
}
step "each rule has a test where it fires and one where it stays quiet" coverage

# Every runbook annotation names a section of docs/metrics.md (a heading
# whose anchor is the part after `#`).
runbooks() {
  python3 - "$rules" docs/metrics.md <<'EOF'
import re, sys
rules, doc = sys.argv[1:]
anchors = {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-")
           for h in re.findall(r"^#+ (.*)$", open(doc, encoding="utf-8").read(), re.M)}
text = open(rules, encoding="utf-8").read()
alerts = re.findall(r"^\s*- alert: (\S+)", text, re.M)
links = re.findall(r"runbook: '([^'#]*)#([^']*)'", text)
bad = [f"{f}#{a}" for f, a in links if f != doc or a not in anchors]
for b in bad:
    print(f"no section for runbook {b}")
if len(links) != len(alerts):
    print(f"{len(alerts)} alerts, {len(links)} runbook annotations")
    bad.append("count")
if not bad:
    print(f"{len(links)} runbooks, each a section of {doc}")
sys.exit(bool(bad))
EOF
}
step "every alert's runbook annotation is a section of docs/metrics.md" runbooks

# One promtool run over every group's file, then a step per group.
cut -f1 "$work/groups.txt" | xargs -r promtool test rules >"$work/unit.txt" 2>&1
group() { # FILE: promtool's verdict on that file, with its failure's detail
  awk -v f="$1" '
    /^Unit Testing: / { on = ($NF == f); next }
    on { print; if ($1 == "SUCCESS") ok = 1 }
    END { exit !ok }' "$work/unit.txt"
}
while IFS=$'\t' read -r file name; do
  step "test group: $name" group "$file"
done <"$work/groups.txt"

# --- the dashboard -----------------------------------------------------------
step "scripts/check-dashboards.py (Grafana's fields; only exported families and labels, in the dashboard and the rules)" \
  python3 scripts/check-dashboards.py --emit-rules "$work/dashboard-exprs.yml" "$dashboard" --rules "$rules"
step "the dashboard's expressions parse (promtool check rules)" promtool check rules "$work/dashboard-exprs.yml"

# The checker must fail on a name that is not a family, in a dashboard and
# in a rules file, and on a label a family does not have.
must_reject() { # FILE WHAT ARGS...: the checker fails on FILE, naming WHAT
  local file=$1 what=$2
  shift 2
  if python3 scripts/check-dashboards.py "$@" >"$work/out.txt" 2>&1; then
    echo "check-dashboards.py passed $file"; cat "$work/out.txt"; return 1
  fi
  grep -F -- "$what" "$work/out.txt" || { echo "it failed, but without naming $what:"; cat "$work/out.txt"; return 1; }
}
sed 's/dlock_keepalive_rtt_seconds_bucket/dlock_keepalive_rtt_bucket/' "$dashboard" >"$work/bad.json"
step "the checker rejects an unknown metric in a dashboard" \
  must_reject bad.json "unknown metric 'dlock_keepalive_rtt_bucket'" "$work/bad.json" --rules "$rules"
sed 's/dlock_deadline_slack_seconds < 5/dlock_deadline_slack < 5/' "$rules" >"$work/bad.yml"
step "the checker rejects an unknown metric in a rules file" \
  must_reject bad.yml "unknown metric 'dlock_deadline_slack'" "$dashboard" --rules "$work/bad.yml"
sed 's/dlock_fences_total{/dlock_fences_total{lock=\\"x\\", /' "$dashboard" >"$work/bad-label.json"
step "the checker rejects a label the family does not have" \
  must_reject bad-label.json "dlock_fences_total has no label 'lock'" "$work/bad-label.json" --rules "$rules"

summary
