#!/usr/bin/env python3
"""Lists every PromQL expression in dashboards/, one JSON object per line.

    python3 dashboards/extract_queries.py [--substitute RANGE] [DASHBOARDS_DIR]

Each line: {"source": ..., "expr": ..., "label_values": ...}. Sources are the
Grafana dashboards (panel targets and template-variable queries; for
`label_values(SELECTOR, label)` the expr is SELECTOR) and every rules file
named by prometheus.yml. --substitute replaces Grafana variables so that
Prometheus's /api/v1/query can evaluate the expression ($__rate_interval,
$__interval, $__range -> RANGE; other $vars -> ".*").

Same listing, same order, as ExtractAllExpressions() in tests/common/promql_refs.h
(tests/common/dashboards_test.cc checks that they agree).
"""
import argparse
import json
import pathlib
import re
import sys

import yaml


def split_label_values(inner):
    depth, comma, i = 0, None, 0
    while i < len(inner):
        c = inner[i]
        if c in "\"'`":
            j = i + 1
            while j < len(inner) and inner[j] != c:
                j += 2 if (inner[j] == "\\" and c != "`") else 1
            i = j + 1
            continue
        if c in "{([":
            depth += 1
        elif c in "})]":
            depth -= 1
        elif c == "," and depth == 0:
            comma = i
        i += 1
    if comma is None:
        return None
    return inner[:comma].strip(), inner[comma + 1:].strip()


def variable_expression(query):
    q = query.strip()
    if q.startswith("label_values(") and q.endswith(")"):
        return split_label_values(q[len("label_values("):-1])
    if q.startswith("query_result(") and q.endswith(")"):
        return q[len("query_result("):-1].strip(), ""
    return q, ""


def panel_exprs(panels, source):
    for panel in panels or []:
        for t in panel.get("targets", []):
            if isinstance(t.get("expr"), str):
                pid = json.dumps(panel["id"]) if "id" in panel else "?"
                yield {"source": f'{source}: panel {pid} '
                                 f'"{panel.get("title", "")}" '
                                 f'{t.get("refId", "")}',
                       "expr": t["expr"], "label_values": ""}
        yield from panel_exprs(panel.get("panels"), source)


def dashboard_exprs(path):
    doc = json.loads(path.read_text())
    yield from panel_exprs(doc.get("panels"), path.name)
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") != "query" or "query" not in var:
            continue
        query = var["query"]
        if isinstance(query, dict):
            query = query.get("query", "")
        parsed = variable_expression(query) if query else None
        if parsed:
            yield {"source": f'{path.name}: variable ${var.get("name", "")}',
                   "expr": parsed[0], "label_values": parsed[1]}


def rule_exprs(path, rel):
    doc = yaml.safe_load(path.read_text())
    for group in doc.get("groups", []):
        for rule in group.get("rules", []):
            name = rule.get("alert", rule.get("record", ""))
            yield {"source": f'{rel}: {group.get("name", "")}/{name}',
                   "expr": rule["expr"].strip(), "label_values": ""}


def all_exprs(root):
    for path in sorted((root / "grafana" / "dashboards").glob("*.json")):
        yield from dashboard_exprs(path)
    config = yaml.safe_load((root / "prometheus.yml").read_text())
    for rel in config.get("rule_files", []):
        yield from rule_exprs(root / rel, rel)


def substitute(expr, rng):
    def repl(m):
        name = m.group(1) or m.group(2)
        return rng if name in ("__rate_interval", "__interval",
                               "__range") else ".*"
    return re.sub(r"\$\{([^}]*)\}|\$([A-Za-z0-9_]*)", repl, expr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?",
                        default=str(pathlib.Path(__file__).resolve().parent))
    parser.add_argument("--substitute", metavar="RANGE")
    args = parser.parse_args()
    for e in all_exprs(pathlib.Path(args.root)):
        if args.substitute:
            e["expr"] = substitute(e["expr"], args.substitute)
        sys.stdout.write(json.dumps(e) + "\n")


if __name__ == "__main__":
    main()
