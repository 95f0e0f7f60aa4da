#!/usr/bin/env python3
"""Checks of the Grafana dashboard and the Prometheus alert rules.

  promql_check.py dashboard DASHBOARD.json RULES_OUT.yml
      Checks the dashboard's structure (a `datasource` variable, no
      `__inputs`, every panel and query on that variable, unique ids, a
      grid without overlaps, the panels the project promises) and writes
      every query as a recording rule to RULES_OUT.yml so that
      `promtool check rules` parses each PromQL expression (Grafana's
      $__rate_interval and friends are replaced by fixed durations).

  promql_check.py names --scrape FILE... --dashboard FILE --rules FILE...
      Checks that every metric the dashboard and the alert rules select is
      one the services export, taken from live /metrics scrapes: the metric
      names, every `label="value"` matcher (the value must occur), and every
      label in by/without/on/ignoring lists.

Exits non-zero and prints each problem when a check fails.
"""
import json
import re
import sys

import yaml

GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "${__rate_interval}": "1m",
    "$__interval": "1m",
    "${__interval}": "1m",
    "$__range": "1h",
    "${__range}": "1h",
}
# Labels Prometheus adds to every scraped series (and `le` of histograms).
TARGET_LABELS = {"job", "instance"}
# Series that Prometheus itself makes, not the services.
PROMETHEUS_SERIES = {"up"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left",
                       "group_right"}

TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[a-zA-Z]*)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){}\[\],@])
""", re.VERBOSE)


def substitute(expr):
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def tokenize(expr):
    tokens, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot tokenize at {expr[pos:pos + 20]!r}")
        pos = m.end()
        if m.lastgroup != "space":
            tokens.append((m.lastgroup, m.group()))
    return tokens


class Usage:
    """What one expression selects."""

    def __init__(self):
        self.selectors = []     # (metric, [(label, op, value)])
        self.label_lists = []   # label names in by/without/on/...


def analyse(expr):
    usage = Usage()
    tokens = tokenize(substitute(expr))
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else None
        if kind == "op" and text == "[":          # range or subquery
            while i < len(tokens) and tokens[i][1] != "]":
                i += 1
        elif kind == "op" and text == "{":        # selector without a name
            i, matchers = matchers_at(tokens, i)
            usage.selectors.append((None, matchers))
            continue
        elif kind == "ident" and text in LABEL_LIST_KEYWORDS:
            if nxt == "(":
                i += 2
                while tokens[i][1] != ")":
                    if tokens[i][0] == "ident":
                        usage.label_lists.append(tokens[i][1])
                    i += 1
        elif kind == "ident" and text.lower() in KEYWORDS:
            pass
        elif kind == "ident" and nxt in ("(", "by", "without"):
            pass                                  # function or aggregation
        elif kind == "ident":
            matchers = []
            if nxt == "{":
                i, matchers = matchers_at(tokens, i + 1)
                usage.selectors.append((text, matchers))
                continue
            usage.selectors.append((text, matchers))
        i += 1
    return usage


def matchers_at(tokens, i):
    """Parses {a="x", b=~"y"} starting at tokens[i] == '{'."""
    matchers = []
    i += 1
    while tokens[i][1] != "}":
        if tokens[i][0] == "ident":
            label, op, value = tokens[i][1], tokens[i + 1][1], tokens[i + 2][1]
            matchers.append((label, op, value[1:-1]))
            i += 3
        else:
            i += 1
    return i + 1, matchers


# ---------------------------------------------------------------- dashboard

REQUIRED_METRICS = {
    "samples/s": "pipetrain_stage_samples_total",
    "loss": "pipetrain_stage_loss",
    "step time": "pipetrain_stage_steps_total",
    "per-stage compute": "pipetrain_stage_compute_seconds_total",
    "idle (bubble)": "pipetrain_stage_idle_seconds_total",
    "the schedule's theoretical bubble": "pipetrain_stage_theoretical_bubble",
    "bytes per pipeline edge": "pipetrain_stage_bytes_total",
    "micro-batches in flight": "pipetrain_stage_micro_batches_in_flight",
    "weight versions": "pipetrain_stage_weight_version",
    "committed versions": "pipetrain_scheduler_committed_version",
    "workers by state": "pipetrain_scheduler_workers",
    "control-call errors": "pipetrain_scheduler_control_call_errors_total",
    "control-call latency": "pipetrain_scheduler_control_call_seconds_bucket",
    "device memory": "pipetrain_stage_device_memory_bytes",
}
REQUIRED_TITLES = ["Samples/s", "Loss", "Step time", "Compute", "bubble",
                   "Bytes per pipeline edge", "in flight", "Weight versions",
                   "skew", "Workers by state", "Control-call errors",
                   "Control-call latency", "Device memory"]


def all_panels(dashboard):
    for panel in dashboard.get("panels", []):
        yield panel
        for inner in panel.get("panels", []):
            yield inner


def dashboard_queries(dashboard):
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            yield panel, target


def check_dashboard(path, rules_out):
    problems = []
    with open(path) as f:
        dashboard = json.load(f)
    if "__inputs" in dashboard:
        problems.append("has __inputs: use the `datasource` variable instead")
    for key in ("uid", "title"):
        if not dashboard.get(key):
            problems.append(f"no {key}")
    if dashboard.get("id") not in (None,):
        problems.append("has a fixed numeric id (leave it out)")
    variables = dashboard.get("templating", {}).get("list", [])
    ds = [v for v in variables if v.get("name") == "datasource"]
    if not ds or ds[0].get("type") != "datasource" or ds[0].get("query") != "prometheus":
        problems.append("no template variable `datasource` of type datasource "
                        "and query prometheus")
    ids, cells = set(), []
    for panel in all_panels(dashboard):
        where = f"panel {panel.get('id')} {panel.get('title')!r}"
        if panel.get("id") in ids:
            problems.append(f"{where}: id used twice")
        ids.add(panel.get("id"))
        g = panel.get("gridPos", {})
        if not all(k in g for k in ("x", "y", "w", "h")) or g["x"] + g["w"] > 24:
            problems.append(f"{where}: bad gridPos {g}")
        else:
            for other, og in cells:
                if (g["x"] < og["x"] + og["w"] and og["x"] < g["x"] + g["w"] and
                        g["y"] < og["y"] + og["h"] and og["y"] < g["y"] + g["h"]):
                    problems.append(f"{where}: overlaps {other}")
            cells.append((where, g))
        if panel.get("type") == "row":
            continue
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"{where}: datasource is not ${{datasource}}")
        if not panel.get("targets"):
            problems.append(f"{where}: no queries")
        refs = [t.get("refId") for t in panel.get("targets", [])]
        if len(set(refs)) != len(refs):
            problems.append(f"{where}: refIds repeat")
        for t in panel.get("targets", []):
            if t.get("datasource", {}).get("uid") != "${datasource}":
                problems.append(f"{where} {t.get('refId')}: datasource is not "
                                "${datasource}")
            if not t.get("expr", "").strip():
                problems.append(f"{where} {t.get('refId')}: empty expr")
    titles = " | ".join(p.get("title", "") for p in all_panels(dashboard))
    for want in REQUIRED_TITLES:
        if want.lower() not in titles.lower():
            problems.append(f"no panel titled like {want!r}")
    used = set()
    rules = []
    for panel, target in dashboard_queries(dashboard):
        expr = target.get("expr", "")
        try:
            used |= {name for name, _ in analyse(expr).selectors if name}
        except (ValueError, IndexError) as e:
            problems.append(f"panel {panel.get('id')}: cannot read {expr!r}: {e}")
        rules.append({"record": f"dashboard:panel_{panel['id']}_{target['refId']}",
                      "expr": substitute(expr)})
    for what, metric in REQUIRED_METRICS.items():
        if metric not in used:
            problems.append(f"{what}: no query uses {metric}")
    with open(rules_out, "w") as f:
        json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, indent=1)
    print(f"dashboard: {len(rules)} queries in {len(ids)} panels written to {rules_out}")
    return problems


# -------------------------------------------------------------------- names

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def read_scrapes(paths):
    """metric name -> list of label dicts, from text exposition files."""
    samples = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                m = SAMPLE.match(line)
                if m is None:
                    continue
                labels = dict(LABEL.findall(m.group(2) or ""))
                samples.setdefault(m.group(1), []).append(labels)
    return samples


def rule_exprs(path):
    with open(path) as f:
        doc = yaml.safe_load(f)
    for group in doc["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule.get("record"), rule["expr"]


def scraped_label(label):
    # A service's own `job` label is renamed `exported_job` on scrape.
    return label[len("exported_"):] if label.startswith("exported_") else label


def check_names(scrapes, dashboard_path, rule_paths):
    samples = read_scrapes(scrapes)
    if not samples:
        return ["the scrapes hold no samples"]
    exprs = []
    with open(dashboard_path) as f:
        dashboard = json.load(f)
    for panel, target in dashboard_queries(dashboard):
        exprs.append((f"dashboard panel {panel['id']} {panel['title']!r} "
                      f"{target['refId']}", target["expr"]))
    for path in rule_paths:
        for name, expr in rule_exprs(path):
            exprs.append((f"{path}: {name}", expr))
    problems, checked = [], set()
    for where, expr in exprs:
        usage = analyse(expr)
        labels_here = set(TARGET_LABELS) | {"le"}
        for name, matchers in usage.selectors:
            if name is None:
                problems.append(f"{where}: selector without a metric name")
                continue
            if name in PROMETHEUS_SERIES:
                continue
            checked.add(name)
            if name not in samples:
                problems.append(f"{where}: {name} is not exported by the services")
                continue
            for labels in samples[name]:
                labels_here |= set(labels)
                labels_here |= {"exported_" + k for k in labels if k in TARGET_LABELS}
            for label, op, value in matchers:
                real = scraped_label(label)
                if label in TARGET_LABELS:
                    continue
                if not any(real in labels for labels in samples[name]):
                    problems.append(f"{where}: {name} has no label {real!r}")
                elif op == "=" and not any(labels.get(real) == value
                                           for labels in samples[name]):
                    values = sorted({labels.get(real) for labels in samples[name]})
                    problems.append(f"{where}: {name}{{{real}={value!r}}} never "
                                    f"occurs (values: {values})")
        for label in usage.label_lists:
            if label not in labels_here:
                problems.append(f"{where}: label {label!r} in by/on/without is on "
                                "none of the selected metrics")
    print(f"names: {len(checked)} metrics checked against "
          f"{len(samples)} exported sample names")
    return problems


def main(argv):
    if len(argv) >= 3 and argv[0] == "dashboard":
        problems = check_dashboard(argv[1], argv[2])
    elif argv and argv[0] == "names":
        scrapes, dashboard, rules, current = [], None, [], None
        for arg in argv[1:]:
            if arg in ("--scrape", "--dashboard", "--rules"):
                current = arg
            elif current == "--scrape":
                scrapes.append(arg)
            elif current == "--dashboard":
                dashboard = arg
            elif current == "--rules":
                rules.append(arg)
        if not scrapes or dashboard is None:
            print(__doc__, file=sys.stderr)
            return 2
        problems = check_names(scrapes, dashboard, rules)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for p in problems:
        print(f"FAIL: {p}")
    print("OK" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
