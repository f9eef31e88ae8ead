#!/usr/bin/env python3
"""Checks the Grafana dashboards and the alert rules that dlock ships (issue 31).

usage: scripts/check-dashboards.py [--families FILE] [--rules FILE]...
                                   [--emit-rules OUT] [DASHBOARD.json ...]

With no arguments: packaging/grafana/*.json and
packaging/prometheus/dlock-alerts.yml against
core/tests/fixtures/metric-families.txt.

A dashboard must parse as JSON and have what Grafana needs to import it:
title, uid, schemaVersion, a datasource variable, panels (rows may nest
panels) each with a type, a title, a gridPos and, unless a row, targets
with a refId and an expression, ids unique.

In every PromQL expression (dashboard targets, its variables'
label_values() queries, the rules' `expr:`), every metric name must be a
family of metric-families.txt in a form the text format exposes: a gauge
or counter by the name listed (counters are listed with `_total`), a
histogram by `_bucket`, `_sum` or `_count`. Prometheus' own `up` is the one
other name allowed. The labels a selector matches on must be the family's
(or `le` on `_bucket`, or the target labels `job` and `instance`), and the
labels of by/without/on/ignoring/group_left/group_right must be one of
those of some family.

--emit-rules OUT writes every dashboard expression (Grafana's variables
replaced by plain values) as a recording rule into OUT, for
`promtool check rules OUT` to parse them with Prometheus' own parser.

Stdlib only. Exit status 0: all good; 1: errors, each printed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_LABELS = {"job", "instance"}
# Names that are not dlock's but may appear: Prometheus' own per target.
EXTRA_METRICS = {"up": ("gauge", [])}
AGGREGATORS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
    "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = AGGREGATORS | GROUPING | {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}

TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<var>\$\{[^}]*\}|\$\w+)
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+(?![\w.]))
  | (?P<number>0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){},@])
  | (?P<other>.)
    """,
    re.VERBOSE,
)


def tokens(expr: str) -> list[tuple[str, str]]:
    out = []
    for m in TOKEN.finditer(expr):
        kind = m.lastgroup
        if kind in ("ws", "comment"):
            continue
        out.append((kind, m.group()))
    return out


def load_families(path: str) -> dict[str, tuple[str, list[str]]]:
    fams: dict[str, tuple[str, list[str]]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, kind, *labels = line.split()
            fams[name] = (kind, labels)
    return fams


def sample_names(fams: dict[str, tuple[str, list[str]]]) -> dict[str, tuple[str, set[str]]]:
    """Every series name the text format exposes -> (family, labels allowed)."""
    names: dict[str, tuple[str, set[str]]] = {}
    for fam, (kind, labels) in {**fams, **EXTRA_METRICS}.items():
        allowed = set(labels) | TARGET_LABELS
        if kind in ("histogram", "summary"):
            for suffix in ("_sum", "_count"):
                names[fam + suffix] = (fam, allowed)
            if kind == "histogram":
                names[fam + "_bucket"] = (fam, allowed | {"le"})
            else:
                names[fam] = (fam, allowed | {"quantile"})
        elif kind == "counter" and not fam.endswith("_total"):
            names[fam + "_total"] = (fam, allowed)
        else:
            names[fam] = (fam, allowed)
    return names


def check_expr(expr: str, names, all_labels: set[str]) -> list[str]:
    """Errors of one PromQL expression: unknown metrics and labels."""
    errs = []
    toks = tokens(expr)
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else None
        if kind == "other":
            errs.append(f"cannot read {text!r} in {expr!r}")
        elif kind == "ident" and text in GROUPING and nxt == "(":
            j = i + 2
            while j < len(toks) and toks[j][1] != ")":
                k, t = toks[j]
                if k == "ident" and t not in all_labels:
                    errs.append(f"unknown label {t!r} in {text} (...)")
                j += 1
            i = j
        elif kind == "ident" and text not in KEYWORDS and nxt != "(":
            metric = text
            if metric not in names:
                errs.append(f"unknown metric {metric!r}")
                allowed = None
            else:
                allowed = names[metric][1]
            if nxt == "{":
                i = check_matchers(toks, i + 1, metric, allowed, errs)
        elif kind == "op" and text == "{":
            errs.append(f"a selector without a metric name in {expr!r}")
            i = check_matchers(toks, i, None, None, errs)
        i += 1
    return errs


def check_matchers(toks, i: int, metric, allowed, errs: list[str]) -> int:
    """toks[i] is `{`: checks the label names up to `}`; returns its index."""
    j = i + 1
    expect_label = True
    while j < len(toks) and toks[j][1] != "}":
        k, t = toks[j]
        if expect_label and k == "ident":
            if allowed is not None and t not in allowed:
                errs.append(f"{metric} has no label {t!r} (it has: {', '.join(sorted(allowed))})")
            expect_label = False
        elif t == ",":
            expect_label = True
        j += 1
    return j


# --- rules files (YAML read by lines: no YAML parser in the stdlib) ---------

def rule_exprs(path: str) -> list[tuple[str, str]]:
    """(rule name, expr) of each rule: `expr: ...` on one line, or a block
    scalar (`expr: |` or `>`, with its more-indented lines)."""
    out = []
    name = "?"
    lines = open(path, encoding="utf-8").read().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"\s*-?\s*(alert|record):\s*(\S+)", line)
        if m:
            name = m.group(2)
        m = re.match(r"(\s*)expr:\s*(.*)$", line)
        if m:
            indent, value = len(m.group(1)), m.group(2).strip()
            if value[:1] in ("|", ">"):
                block = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i].strip())
                    i += 1
                out.append((name, " ".join(block).strip()))
                continue
            if value[:1] in ("'", '"'):
                q = value[0]
                value = value[1:value.rindex(q)]
                value = value.replace("''", "'") if q == "'" else json.loads(f'"{value}"')
            out.append((name, value))
        i += 1
    return out


# --- dashboards -----------------------------------------------------------

VARIABLES = {
    "$__rate_interval": "1m", "${__rate_interval}": "1m", "$__interval": "1m",
    "${__interval}": "1m", "$__range": "1h", "${__range}": "1h",
}


def plain(expr: str) -> str:
    """Grafana's variables replaced by values Prometheus parses."""
    for k, v in VARIABLES.items():
        expr = expr.replace(k, v)
    return re.sub(r"\$\{\w+(?::\w+)?\}|\$\w+", ".*", expr)


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels") or [])


def check_dashboard(path: str, names, all_labels, exprs_out: list) -> list[str]:
    errs = []
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        return [f"does not parse: {e}"]
    if not isinstance(d, dict):
        return ["not a JSON object"]
    for field, kind in (("title", str), ("uid", str), ("schemaVersion", int), ("panels", list)):
        if not isinstance(d.get(field), kind) or (kind is not int and not d.get(field)):
            errs.append(f"no {field} ({kind.__name__})")
    if isinstance(d.get("uid"), str) and not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", d["uid"]):
        errs.append(f"uid {d['uid']!r}: Grafana takes at most 40 of [A-Za-z0-9_-]")
    variables = (d.get("templating") or {}).get("list") or []
    ds_vars = [v.get("name") for v in variables if v.get("type") == "datasource"]
    if not ds_vars:
        errs.append("no datasource variable (templating.list, type datasource)")
    for v in variables:
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", q or "")
        if not m:
            errs.append(f"variable {v.get('name')}: query {q!r} is not label_values(selector, label)")
            continue
        sel, label = m.groups()
        errs += [f"variable {v.get('name')}: {e}" for e in check_expr(sel, names, all_labels)]
        if label not in all_labels:
            errs.append(f"variable {v.get('name')}: unknown label {label!r}")
        exprs_out.append((f"variable_{v.get('name')}", plain(sel)))
    ids = set()
    panels = list(walk_panels(d.get("panels") or []))
    for p in panels:
        where = f"panel {p.get('title')!r}"
        if p.get("id") in ids:
            errs.append(f"{where}: id {p.get('id')} used twice")
        ids.add(p.get("id"))
        for field in ("type", "title", "gridPos"):
            if not p.get(field):
                errs.append(f"{where}: no {field}")
        if p.get("type") == "row":
            continue
        ds = (p.get("datasource") or {}).get("uid") if isinstance(p.get("datasource"), dict) else p.get("datasource")
        if ds_vars and ds not in {f"${{{n}}}" for n in ds_vars} | {f"${n}" for n in ds_vars}:
            errs.append(f"{where}: datasource {ds!r} is not the datasource variable")
        targets = p.get("targets") or []
        if not targets:
            errs.append(f"{where}: no targets")
        for t in targets:
            expr = t.get("expr")
            if not t.get("refId") or not expr:
                errs.append(f"{where}: a target without refId or expr")
                continue
            errs += [f"{where} {t['refId']}: {e}" for e in check_expr(expr, names, all_labels)]
            exprs_out.append((f"panel_{p.get('id')}_{t['refId']}", plain(expr)))
    if not any(p.get("type") != "row" for p in panels):
        errs.append("no panel with targets")
    return errs


def shown(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dashboards", nargs="*")
    ap.add_argument("--families", default=os.path.join(ROOT, "core/tests/fixtures/metric-families.txt"))
    ap.add_argument("--rules", action="append")
    ap.add_argument("--emit-rules", metavar="OUT")
    a = ap.parse_args()
    dashboards = a.dashboards or sorted(glob.glob(os.path.join(ROOT, "packaging/grafana/*.json")))
    rules = a.rules if a.rules is not None else [os.path.join(ROOT, "packaging/prometheus/dlock-alerts.yml")]
    fams = load_families(a.families)
    names = sample_names(fams)
    all_labels = set(TARGET_LABELS) | {"le"}
    for _, labels in fams.values():
        all_labels |= set(labels)

    failed = 0
    checked = 0
    exprs: list[tuple[str, str]] = []
    for path in dashboards:
        errs = check_dashboard(path, names, all_labels, exprs)
        checked += 1
        failed += bool(errs)
        for e in errs:
            print(f"error: {shown(path)}: {e}")
        if not errs:
            print(f"ok: {shown(path)}")
    for path in rules:
        errs = []
        found = rule_exprs(path)
        rules_named = len(re.findall(r"^\s*-?\s*(?:alert|record):", open(path, encoding="utf-8").read(), re.M))
        if not found:
            errs.append("no rule with an expr")
        elif len(found) != rules_named:
            errs.append(f"{rules_named} rules but {len(found)} expressions read (an expr this reader cannot read?)")
        for name, expr in found:
            errs += [f"{name}: {e}" for e in check_expr(expr, names, all_labels)]
        checked += 1
        failed += bool(errs)
        for e in errs:
            print(f"error: {shown(path)}: {e}")
        if not errs:
            print(f"ok: {shown(path)} ({len(found)} expressions)")
    if not dashboards and not rules:
        print("error: nothing to check")
        return 1
    if a.emit_rules:
        with open(a.emit_rules, "w", encoding="utf-8") as f:
            f.write("groups:\n  - name: dashboard-expressions\n    rules:\n")
            for name, expr in exprs:
                f.write(f"      - record: dashboard_{re.sub(r'[^A-Za-z0-9_]', '_', name)}\n")
                f.write(f"        expr: {json.dumps(expr)}\n")
    print(f"check-dashboards: {checked - failed} of {checked} files good")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
