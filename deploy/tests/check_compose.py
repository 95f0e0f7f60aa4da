#!/usr/bin/env python3
"""Checks deploy/docker-compose.yml as Docker Compose resolves it (all
profiles on) for what the deployment promises: health checks and restart
policies, the scheduler's data volume, GPU workers with NVIDIA device
reservations and the CUDA image, flags the binaries really have, workers
that advertise their own service name, and a Prometheus scrape config that
matches the services and their ports.

  check_compose.py COMPOSE_FILE BIN_DIR
"""
import os
import sys

import yaml

from compose_lib import (argv, binary_flags, flag, healthcheck_url,
                         published_ports, resolved_config, volumes)

problems = []


def fail(message):
    problems.append(message)


def main(compose_file, bin_dir):
    config = resolved_config(compose_file, ["gpu", "tools"])
    services = config["services"]
    want = {"scheduler", "worker-1", "worker-2", "gpu-worker-1", "gpu-worker-2",
            "ctl", "prometheus", "grafana"}
    if not want <= set(services):
        fail(f"services {sorted(services)} lack {sorted(want - set(services))}")
        return
    flags = {b: binary_flags(os.path.join(bin_dir, p)) for b, p in (
        ("pipetrain-scheduler", "pipetrain-scheduler"),
        ("pipetrain-worker", "pipetrain-worker"),
        ("pipetrainctl", "ctl/pipetrainctl"))}
    for b, f in flags.items():
        if not f:
            fail(f"{b} --helpfull listed no flags")

    for name, s in services.items():
        if name not in ("ctl", "pki"):  # run once, on demand
            if not s.get("healthcheck", {}).get("test"):
                fail(f"{name}: no health check")
            if s.get("restart") not in ("always", "unless-stopped", "on-failure"):
                fail(f"{name}: restart policy {s.get('restart')!r}")
        args = argv(s)
        if args and args[0] in flags:
            for a in args[1:]:
                key = a[2:].split("=", 1)[0] if a.startswith("--") else None
                if key is not None and key not in flags[args[0]]:
                    fail(f"{name}: {args[0]} has no flag --{key}")

    # Secure by default: mutual TLS everywhere, tokens, loopback-only ports,
    # no anonymous Grafana.
    for name, s in services.items():
        args = argv(s)
        if args and args[0].startswith("pipetrain"):
            for f in ("tls_cert", "tls_key", "tls_ca"):
                if not flag(args, f):
                    fail(f"{name}: no --{f} (mutual TLS)")
            if "--insecure" in args:
                fail(f"{name}: runs --insecure")
        for p in s.get("ports", []):
            host_ip = p.get("host_ip") if isinstance(p, dict) else str(p).rsplit(":", 2)[0]
            if host_ip != "127.0.0.1":
                fail(f"{name}: publishes {p} beyond 127.0.0.1")
    sargs0 = argv(services["scheduler"])
    if not flag(sargs0, "auth_tokens_file") or not flag(sargs0, "join_token_file"):
        fail("scheduler: no --auth_tokens_file or --join_token_file")
    genv = services["grafana"].get("environment", {})
    if str(genv.get("GF_AUTH_ANONYMOUS_ENABLED", "false")).lower() != "false" or \
            genv.get("GF_SECURITY_ADMIN_PASSWORD") in (None, "", "admin"):
        fail("grafana: anonymous access on or the admin password not from the environment")

    # Scheduler.
    sched = services["scheduler"]
    sargs = argv(sched)
    grpc_port = int(flag(sargs, "listen").rsplit(":", 1)[1])
    http_port = int(flag(sargs, "http_port"))
    data_dir = flag(sargs, "data_dir")
    mounts = dict((t, src) for src, t in volumes(sched))
    if data_dir not in mounts:
        fail(f"scheduler: --data_dir={data_dir} is not on a volume")
    elif mounts[data_dir] not in (config.get("volumes") or {}):
        fail(f"scheduler: {data_dir} is not on a named volume")
    ports = published_ports(sched)
    if grpc_port not in ports or http_port not in ports:
        fail(f"scheduler: gRPC {grpc_port} and HTTP {http_port} are not both published")
    if healthcheck_url(sched) != f"https://127.0.0.1:{http_port}/readyz":
        fail(f"scheduler: health check {healthcheck_url(sched)} is not /readyz on {http_port}")
    if not sched.get("build"):
        fail("scheduler: no build section (it builds the CPU image)")

    # Workers.
    workers = {n: s for n, s in services.items()
               if argv(s) and argv(s)[0] == "pipetrain-worker"}
    zones = set()
    for name, w in workers.items():
        args = argv(w)
        listen_port = int(flag(args, "listen").rsplit(":", 1)[1])
        metrics_port = int(flag(args, "metrics_port"))
        if flag(args, "scheduler") != f"scheduler:{grpc_port}":
            fail(f"{name}: --scheduler={flag(args, 'scheduler')}")
        if flag(args, "advertise") != f"{name}:{listen_port}":
            fail(f"{name}: --advertise={flag(args, 'advertise')}, want {name}:{listen_port}")
        if flag(args, "worker_id") != name:
            fail(f"{name}: --worker_id is not the service name")
        labels = dict(kv.split("=", 1) for kv in (flag(args, "labels") or "").split(",") if kv)
        zones.add(labels.get("zone"))
        if healthcheck_url(w) != f"https://127.0.0.1:{metrics_port}/healthz":
            fail(f"{name}: health check {healthcheck_url(w)} is not /healthz on {metrics_port}")
        depends = w.get("depends_on", {})
        if not isinstance(depends, dict) or \
                depends.get("scheduler", {}).get("condition") != "service_healthy":
            fail(f"{name}: does not wait for a healthy scheduler")
        devices = (w.get("deploy", {}).get("resources", {}).get("reservations", {})
                   .get("devices", []))
        gpu = name.startswith("gpu-")
        if gpu:
            if "gpu" not in w.get("profiles", []):
                fail(f"{name}: not in the gpu profile")
            if not any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])
                       for d in devices):
                fail(f"{name}: no NVIDIA GPU device reservation")
            if flag(args, "device") != "cuda":
                fail(f"{name}: --device is not cuda")
            if w["image"] == sched["image"]:
                fail(f"{name}: runs the CPU image")
        else:
            if w.get("profiles"):
                fail(f"{name}: CPU workers must run by default (no profile)")
            if devices or flag(args, "device") != "cpu":
                fail(f"{name}: a CPU worker reserves devices or is not --device=cpu")
            if w["image"] != sched["image"]:
                fail(f"{name}: does not run the scheduler's (CPU) image")
    builds = [s["build"] for s in workers.values() if s.get("build")]
    cuda_images = {s["image"] for n, s in workers.items() if n.startswith("gpu-")}
    if len(builds) != 1 or len(cuda_images) != 1:
        fail("want exactly one GPU worker that builds the one CUDA image")
    else:
        a = builds[0].get("args", {})
        b, r = a.get("BUILD_BASE", ""), a.get("RUNTIME_BASE", "")
        if a.get("PIPETRAIN_CUDA") != "ON" or not b.startswith("nvidia/cuda:") or \
                b.replace("-devel-", "-runtime-") != r:
            fail(f"CUDA build args {a}: want PIPETRAIN_CUDA=ON and matching "
                 "nvidia/cuda devel and runtime bases")
    zb = flag(sargs, "zone_bandwidth") or ""
    for item in filter(None, zb.split(",")):
        for zone in item.split("=", 1)[0].split("-"):
            if zone not in zones:
                fail(f"scheduler: --zone_bandwidth names zone {zone!r}, which no worker has")

    # ctl.
    ctl = services["ctl"]
    if ctl.get("environment", {}).get("PIPETRAIN_SCHEDULER") != f"scheduler:{grpc_port}":
        fail("ctl: PIPETRAIN_SCHEDULER is not the scheduler's gRPC address")

    # Prometheus: its mounted config scrapes exactly these services.
    prom = services["prometheus"]
    config_file = flag(argv(prom), "config.file")
    host_path = None
    for src, target in volumes(prom):
        if config_file.startswith(target.rstrip("/") + "/"):
            host_path = os.path.join(src, config_file[len(target.rstrip("/")) + 1:])
    if host_path is None or not os.path.isfile(host_path):
        fail(f"prometheus: --config.file={config_file} is not in a mounted folder")
        return
    with open(host_path) as f:
        prom_config = yaml.safe_load(f)
    for rule_file in prom_config.get("rule_files", []):
        if not os.path.isfile(os.path.join(os.path.dirname(host_path), rule_file)):
            fail(f"prometheus: rule file {rule_file} is not beside its config")
    jobs = {j["job_name"]: j for j in prom_config["scrape_configs"]}
    sched_targets = [t for c in jobs.get("pipetrain-scheduler", {}).get("static_configs", [])
                     for t in c["targets"]]
    if sched_targets != [f"scheduler:{http_port}"]:
        fail(f"prometheus: scheduler targets {sched_targets}, want scheduler:{http_port}")
    dns = jobs.get("pipetrain-worker", {}).get("dns_sd_configs", [{}])[0]
    worker_ports = {int(flag(argv(w), "metrics_port")) for w in workers.values()}
    if set(dns.get("names", [])) != set(workers) or {dns.get("port")} != worker_ports:
        fail(f"prometheus: worker discovery {dns} does not match the workers "
             f"{sorted(workers)} on {worker_ports}")
    for name in ("prometheus", "grafana"):
        for src, _ in volumes(services[name]):
            if src.startswith("/") and not os.path.exists(src):
                fail(f"{name}: mounts {src}, which does not exist")
        if not published_ports(services[name]):
            fail(f"{name}: no published port")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        main(sys.argv[1], sys.argv[2])
    except Exception as e:  # a malformed file is a failed check too
        fail(f"{type(e).__name__}: {e}")
    for p in problems:
        print(f"FAIL: {p}")
    print("OK" if not problems else f"{len(problems)} problem(s)")
    sys.exit(1 if problems else 0)
