#!/usr/bin/env python3
"""Checks the manifests `helm template` rendered from helm/pipetrain for
what the chart promises.

  check_helm.py SCENARIO RENDERED.yaml REPO_ROOT BIN_DIR

SCENARIO is default, gpu (examples/values-gpu.yaml), cloud-edge
(examples/values-cloud-edge.yaml) or ephemeral (persistence off). Every
flag passed to a binary must be one the binary has (from its --helpfull).
Prints each problem and exits non-zero when there is one.
"""
import json
import os
import re
import subprocess
import sys

import yaml

problems = []


def fail(message):
    problems.append(message)


def flags_of(binary):
    out = subprocess.run([binary, "--helpfull"], capture_output=True, text=True,
                         timeout=30)
    flags = set(re.findall(r"^\s+--([a-zA-Z0-9_]+) ", out.stdout + out.stderr, re.M))
    if not flags:
        fail(f"{binary} --helpfull listed no flags")
    return flags


def check_flags(where, args, known):
    for arg in args:
        m = re.match(r"^--([a-zA-Z0-9_]+)(=|$)", arg)
        if m is None:
            fail(f"{where}: argument {arg!r} is not --flag=value")
        elif m.group(1) not in known:
            fail(f"{where}: {arg!r}: the binary has no flag --{m.group(1)}")


def arg_value(args, flag):
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{flag}=")]
    return values[-1] if values else None


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def check_grpc_probes(where, container):
    """gRPC health probes on the grpc port; under mutual TLS (which the
    kubelet's gRPC probe cannot speak) HTTP probes on a declared port."""
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    tls = arg_value(container.get("args", []), "tls_cert") is not None
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        p = container.get(probe)
        if tls:
            if p is None or "httpGet" not in p or \
                    p["httpGet"].get("port") not in ports.values():
                fail(f"{where}: under TLS, {probe} is not an HTTP probe of a declared port")
        elif p is None or "grpc" not in p:
            fail(f"{where}: no gRPC {probe} (grpc.health.v1)")
        elif p["grpc"].get("port") != ports.get("grpc"):
            fail(f"{where}: {probe} probes port {p['grpc'].get('port')}, "
                 f"not the grpc port {ports.get('grpc')}")


def check_secured(where, container, volumes):
    """Mutual TLS and the join token from mounted Secrets, unless the chart
    was told --insecure."""
    args = container.get("args", [])
    if "--insecure" in args:
        return
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    for flag in ("tls_cert", "tls_key", "tls_ca", "join_token_file"):
        value = arg_value(args, flag)
        if value is None:
            fail(f"{where}: no --{flag} (and not --insecure)")
            continue
        mount = [m for m in mounts if value.startswith(m.rstrip("/") + "/")]
        if not mount or "secret" not in volumes.get(mounts[mount[0]], {}):
            fail(f"{where}: --{flag}={value} is not in a mounted Secret")


def check_env_refs(where, container):
    defined = {e["name"] for e in container.get("env", [])}
    for arg in container.get("args", []):
        for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
            if var not in defined:
                fail(f"{where}: {arg!r} uses $({var}), which env does not define")


def check_security(where, pod, container):
    if not pod.get("securityContext", {}).get("runAsNonRoot"):
        fail(f"{where}: pod does not set runAsNonRoot")
    sc = container.get("securityContext", {})
    if sc.get("allowPrivilegeEscalation") is not False:
        fail(f"{where}: allowPrivilegeEscalation is not false")


def main(scenario, rendered, root, bin_dir):
    with open(rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    scheduler_flags = flags_of(os.path.join(bin_dir, "pipetrain-scheduler"))
    worker_flags = flags_of(os.path.join(bin_dir, "pipetrain-worker"))

    # ---- scheduler: Deployment, Service, PVC
    deployments = by_kind.get("Deployment", [])
    if len(deployments) != 1:
        fail(f"want 1 Deployment (the scheduler), got {len(deployments)}")
        return
    dep = deployments[0]
    spec = dep["spec"]
    if spec.get("replicas") != 1 or spec.get("strategy", {}).get("type") != "Recreate":
        fail("scheduler: want 1 replica and the Recreate strategy (one SQLite owner)")
    pod = spec["template"]["spec"]
    if not matches(spec["selector"]["matchLabels"], spec["template"]["metadata"]["labels"]):
        fail("scheduler: selector does not match its pod labels")
    sched = pod["containers"][0]
    where = "scheduler"
    if sched.get("command") != ["pipetrain-scheduler"]:
        fail(f"{where}: command is {sched.get('command')}")
    check_flags(where, sched["args"], scheduler_flags)
    check_grpc_probes(where, sched)
    sched_volumes = {v["name"]: v for v in pod.get("volumes", [])}
    check_secured(where, sched, sched_volumes)
    if "--insecure" not in sched["args"] and arg_value(sched["args"], "auth_tokens_file") is None:
        fail(f"{where}: no --auth_tokens_file")
    check_security(where, pod, sched)
    ports = {p["name"]: p["containerPort"] for p in sched["ports"]}
    if arg_value(sched["args"], "listen") != f"0.0.0.0:{ports.get('grpc')}":
        fail(f"{where}: --listen does not serve the grpc port {ports.get('grpc')}")
    if arg_value(sched["args"], "http_port") != str(ports.get("http")):
        fail(f"{where}: --http_port is not the http port {ports.get('http')}")
    data_dir = arg_value(sched["args"], "data_dir")
    mounts = {m["mountPath"]: m["name"] for m in sched.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    if data_dir not in mounts:
        fail(f"{where}: --data_dir={data_dir} is not a mounted volume")
    data_volume = volumes.get(mounts.get(data_dir), {})
    pvcs = {p["metadata"]["name"]: p for p in by_kind.get("PersistentVolumeClaim", [])}
    if scenario == "ephemeral":
        if "emptyDir" not in data_volume or pvcs:
            fail(f"{where}: persistence off should give an emptyDir and no PVC")
    else:
        claim = data_volume.get("persistentVolumeClaim", {}).get("claimName")
        if claim not in pvcs:
            fail(f"{where}: the data volume's claim {claim!r} is not rendered "
                 f"(PVCs: {sorted(pvcs)})")
        else:
            pvc = pvcs[claim]["spec"]
            if "ReadWriteOnce" not in pvc.get("accessModes", []) or \
                    not pvc.get("resources", {}).get("requests", {}).get("storage"):
                fail(f"{where}: PVC {claim} lacks ReadWriteOnce or a size")

    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    sched_svc = [s for s in services.values()
                 if matches(s["spec"]["selector"], spec["template"]["metadata"]["labels"])]
    if len(sched_svc) != 1:
        fail(f"scheduler: want one Service selecting it, got {len(sched_svc)}")
        return
    sched_svc = sched_svc[0]
    svc_ports = {p["name"]: p for p in sched_svc["spec"]["ports"]}
    for name in ("grpc", "http"):
        if name not in svc_ports or svc_ports[name]["targetPort"] not in (name, ports.get(name)):
            fail(f"scheduler Service: no port {name} targeting the container's {name}")
    scheduler_address = f"{sched_svc['metadata']['name']}:{svc_ports['grpc']['port']}"

    # ---- workers: StatefulSets and the headless Service
    sets = by_kind.get("StatefulSet", [])
    if not sets:
        fail("no worker StatefulSet")
        return
    headless = [s for s in services.values() if s["spec"].get("clusterIP") == "None"]
    if len(headless) != 1:
        fail(f"want one headless Service for the workers, got {len(headless)}")
        return
    headless = headless[0]
    hname = headless["metadata"]["name"]
    hports = {p["name"] for p in headless["spec"]["ports"]}
    if not {"grpc", "metrics"} <= hports:
        fail(f"headless Service: ports {sorted(hports)}, want grpc and metrics")
    pools = {}
    for sts in sets:
        name = sts["metadata"]["name"]
        where = f"StatefulSet {name}"
        s = sts["spec"]
        labels = s["template"]["metadata"]["labels"]
        if s.get("serviceName") != hname:
            fail(f"{where}: serviceName {s.get('serviceName')!r} is not the headless {hname!r}")
        if not matches(s["selector"]["matchLabels"], labels):
            fail(f"{where}: selector does not match its pod labels")
        if not matches(headless["spec"]["selector"], labels):
            fail(f"{where}: the headless Service does not select its pods")
        pod = s["template"]["spec"]
        c = pod["containers"][0]
        if c.get("command") != ["pipetrain-worker"]:
            fail(f"{where}: command is {c.get('command')}")
        check_flags(where, c["args"], worker_flags)
        check_grpc_probes(where, c)
        check_secured(where, c, {v["name"]: v for v in pod.get("volumes", [])})
        check_env_refs(where, c)
        check_security(where, pod, c)
        cports = {p["name"]: p["containerPort"] for p in c["ports"]}
        if arg_value(c["args"], "listen") != f"0.0.0.0:{cports.get('grpc')}":
            fail(f"{where}: --listen does not serve the grpc port")
        if arg_value(c["args"], "metrics_port") != str(cports.get("metrics")):
            fail(f"{where}: --metrics_port is not the metrics port")
        if arg_value(c["args"], "scheduler") != scheduler_address:
            fail(f"{where}: --scheduler={arg_value(c['args'], 'scheduler')}, "
                 f"want {scheduler_address}")
        advertise = arg_value(c["args"], "advertise") or ""
        if not advertise.startswith(f"$(POD_NAME).{hname}.$(POD_NAMESPACE).svc.") or \
                not advertise.endswith(f":{cports.get('grpc')}"):
            fail(f"{where}: --advertise={advertise} is not the pod's stable name")
        worker_labels = dict(kv.split("=", 1) for kv in
                             (arg_value(c["args"], "labels") or "").split(",") if kv)
        if "zone" not in worker_labels:
            fail(f"{where}: --labels has no zone")
        gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        pools[labels.get("pipetrain.io/pool")] = {
            "gpus": gpus, "device": arg_value(c["args"], "device"),
            "zone": worker_labels.get("zone"), "pod": pod, "image": c["image"],
            "replicas": s.get("replicas")}

    def want_gpu_pool(pool_name):
        p = pools.get(pool_name)
        if p is None:
            fail(f"no worker pool {pool_name!r} (pools: {sorted(pools)})")
            return
        where = f"pool {pool_name}"
        if p["gpus"] != 1:
            fail(f"{where}: nvidia.com/gpu limit is {p['gpus']}, want 1")
        if p["device"] != "cuda":
            fail(f"{where}: --device={p['device']}, want cuda")
        if not p["image"].endswith("-cuda"):
            fail(f"{where}: image {p['image']} is not the CUDA image")
        pod = p["pod"]
        if pod.get("runtimeClassName") != "nvidia":
            fail(f"{where}: runtimeClassName {pod.get('runtimeClassName')!r}, want nvidia")
        if pod.get("nodeSelector", {}).get("nvidia.com/gpu.present") != "true":
            fail(f"{where}: nodeSelector lacks nvidia.com/gpu.present")
        if not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])):
            fail(f"{where}: no toleration for nvidia.com/gpu")

    def want_cpu_pool(pool_name):
        p = pools.get(pool_name)
        if p is None:
            fail(f"no worker pool {pool_name!r} (pools: {sorted(pools)})")
            return
        if p["gpus"] is not None or p["image"].endswith("-cuda"):
            fail(f"pool {pool_name}: a CPU pool requests GPUs or runs the CUDA image")

    kinds = set(by_kind)
    if scenario in ("default", "ephemeral"):
        want_cpu_pool("cpu")
        for k in ("ServiceMonitor", "PrometheusRule", "PodDisruptionBudget", "ConfigMap"):
            if k in kinds:
                fail(f"{scenario}: {k} rendered although it is off by default")
        if "prometheus.io/scrape" not in sets[0]["spec"]["template"]["metadata"].get(
                "annotations", {}):
            fail("default: workers lack prometheus.io/scrape annotations")
    if scenario == "gpu":
        want_gpu_pool("gpu")
        check_monitoring(by_kind, root, labels={"release": "kube-prometheus-stack"})
        pdbs = by_kind.get("PodDisruptionBudget", [])
        if len(pdbs) != 1 or not all(matches(pdbs[0]["spec"]["selector"]["matchLabels"],
                                             st["spec"]["template"]["metadata"]["labels"])
                                     for st in sets):
            fail("gpu: want one PodDisruptionBudget selecting every worker")
    if scenario == "cloud-edge":
        want_gpu_pool("cloud")
        want_cpu_pool("edge")
        if pools.get("cloud", {}).get("zone") != "cloud" or \
                pools.get("edge", {}).get("zone") != "edge":
            fail("cloud-edge: workers are not labelled zone=cloud / zone=edge")
        zb = arg_value(sched["args"], "zone_bandwidth") or ""
        zones = set()
        for item in zb.split(","):
            pair = item.split("=", 1)[0]
            zones |= set(pair.split("-"))
        if zones != {"cloud", "edge"}:
            fail(f"cloud-edge: --zone_bandwidth={zb!r} does not link cloud and edge")
        edge_pod = pools.get("edge", {}).get("pod", {})
        if not edge_pod.get("nodeSelector") or not edge_pod.get("tolerations"):
            fail("cloud-edge: the edge pool has no nodeSelector or tolerations")
    for p in problems:
        print(f"FAIL [{scenario}]: {p}")
    print(f"[{scenario}] {len(docs)} manifests, {len(sets)} worker pool(s): "
          f"{'OK' if not problems else f'{len(problems)} problem(s)'}")


def check_monitoring(by_kind, root, labels):
    monitors = by_kind.get("ServiceMonitor", [])
    jobs = set()
    for m in monitors:
        if not matches(labels, m["metadata"]["labels"]):
            fail(f"ServiceMonitor {m['metadata']['name']}: lacks the extra labels {labels}")
        for e in m["spec"]["endpoints"]:
            for r in e.get("relabelings", []):
                if r.get("targetLabel") == "job":
                    jobs.add(r.get("replacement"))
    if jobs != {"pipetrain-scheduler", "pipetrain-worker"}:
        fail(f"ServiceMonitors set job to {sorted(jobs)}, want pipetrain-scheduler "
             "and pipetrain-worker (the alerts select them)")
    with open(os.path.join(root, "deploy/prometheus/alerts.yml")) as f:
        alerts = yaml.safe_load(f)
    rules = by_kind.get("PrometheusRule", [])
    if len(rules) != 1 or rules[0]["spec"]["groups"] != alerts["groups"]:
        fail("the PrometheusRule does not hold deploy/prometheus/alerts.yml's groups")
    elif not matches(labels, rules[0]["metadata"]["labels"]):
        fail("the PrometheusRule lacks the extra labels")
    maps = [c for c in by_kind.get("ConfigMap", [])
            if c["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    with open(os.path.join(root, "deploy/grafana/dashboards/pipetrain.json")) as f:
        dashboard = json.load(f)
    if len(maps) != 1:
        fail("no dashboard ConfigMap labelled grafana_dashboard: \"1\"")
    elif json.loads(maps[0]["data"]["pipetrain.json"]) != dashboard:
        fail("the dashboard ConfigMap differs from deploy/grafana/dashboards/pipetrain.json")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(*sys.argv[1:])
    sys.exit(1 if problems else 0)
