#!/usr/bin/env python3
"""The docker compose topology, exercised without Docker.

Reads deploy/docker-compose.yml through `docker-compose config` and starts
its pipetrain services (the scheduler and the CPU workers of the default
profile) as local processes with the same command lines and environment,
in the order of their depends_on, each once the ones it depends on pass
their compose health check (run for real, with curl). Only what a sandbox
forces changes:
  - every published or internal port P of service S becomes a free
    loopback port, and `S:P` / `0.0.0.0:P` in flags and environment follow;
  - the HTTP endpoints are told to bind 127.0.0.1 only (--http_host,
    --metrics_host);
  - volume mount points become temporary folders, and the image's
    /opt/pipetrain/examples is the repository's examples/.
Then the compose `ctl` service submits a short version of the example job
with `pipetrainctl submit --watch`, which must see it complete. Meanwhile
the compose Prometheus configuration (deploy/prometheus/prometheus.yml, its
targets remapped the same way) runs with Debian's prometheus binary: every
target must be up, the alert rules healthy, and every dashboard query must
run, the core ones with data.

  compose_topology_test.py BIN_DIR
"""
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compose_lib import (argv, flag, published_ports, resolved_config,  # noqa: E402
                         volumes)

ROOT = os.environ.get("PIPETRAIN_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "../.."))
COMPOSE = os.path.join(ROOT, "deploy/docker-compose.yml")
IMAGE_EXAMPLES = "/opt/pipetrain/examples"
# Dashboard queries that must return data while a job runs.
MUST_HAVE_DATA = ["Samples/s", "Loss", "Step time", "Compute by stage and phase",
                  "Idle (bubble) fraction vs. the schedule's theory",
                  "Bytes per pipeline edge", "Weight versions", "Workers by state",
                  "Device memory", "Control-call latency"]


def log(message):
    print(message, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Topology:
    def __init__(self, bin_dir, tmp):
        self.bin_dir = bin_dir
        self.tmp = tmp
        self.ports = {}       # (service, container port) -> local port
        self.processes = {}   # service -> Popen
        self.logs = {}

    # ---- remapping
    def port(self, service, container_port):
        key = (service, int(container_port))
        if key not in self.ports:
            self.ports[key] = free_port()
        return self.ports[key]

    def listened_ports(self, service, args):
        ports = []
        listen = flag(args, "listen")
        if listen:
            ports.append(int(listen.rsplit(":", 1)[1]))
        for name in ("http_port", "metrics_port"):
            if flag(args, name):
                ports.append(int(flag(args, name)))
        return ports

    def remap_value(self, service, value, services, mounts):
        def host_port(m):
            host, port = m.group(1), m.group(2)
            if host in ("0.0.0.0", "127.0.0.1", "localhost"):
                return f"127.0.0.1:{self.port(service, port)}"
            if host in services:
                return f"127.0.0.1:{self.port(host, port)}"
            return m.group(0)
        value = re.sub(r"([A-Za-z0-9_.-]+):(\d+)", host_port, value)
        if mounts:
            # Whole paths only, the longest mount point first (/pki must not
            # rewrite /opt/pipetrain/pki.sh).
            points = "|".join(re.escape(t) for t in sorted(mounts, key=len, reverse=True))
            value = re.sub(f"({points})(?=/|$|[^A-Za-z0-9_.-])",
                           lambda m: mounts[m.group(1)], value)
        return value.replace(IMAGE_EXAMPLES, os.path.join(ROOT, "examples"))

    def mounts(self, name, service):
        """{mount point: local path}: a bind mount's own source, one shared
        folder per named volume (as Docker shares the volume)."""
        mounts = {}
        for source, target in volumes(service):
            if source.startswith("/"):
                mounts[target] = source
                continue
            local = os.path.join(self.tmp, "volume_" + source)
            os.makedirs(local, exist_ok=True)
            mounts[target] = local
        return mounts

    def run_init(self, name, service, services):
        """Runs a one-shot service (the pki maker) to completion."""
        mounts = self.mounts(name, service)
        cmd = [self.remap_value(name, a, services, mounts) for a in argv(service)]
        log(f"run {name}: {' '.join(cmd)}")
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise AssertionError(f"{name} exited {out.returncode}:\n{out.stdout}{out.stderr}")

    def command(self, name, service, services):
        args = argv(service)
        mounts = self.mounts(name, service)
        out = []
        for a in args[1:]:
            if a.startswith("--http_port=") or a.startswith("--metrics_port="):
                key, value = a.split("=", 1)
                a = f"{key}={self.port(name, value)}"
            out.append(self.remap_value(name, a, services, mounts))
        if args[0] == "pipetrain-scheduler":
            out.append("--http_host=127.0.0.1")
        if args[0] == "pipetrain-worker":
            out.append("--metrics_host=127.0.0.1")
        binary = os.path.join(self.bin_dir, "ctl" if args[0] == "pipetrainctl" else "",
                              args[0])
        env = dict(os.environ)
        for key, value in (service.get("environment") or {}).items():
            env[key] = self.remap_value(name, str(value), services, mounts)
        return [binary] + out, env

    # ---- processes
    def start(self, name, service, services):
        cmd, env = self.command(name, service, services)
        self.listened_ports(name, argv(service))
        log_path = os.path.join(self.tmp, f"{name}.log")
        self.logs[name] = log_path
        log(f"start {name}: {' '.join(cmd)}")
        with open(log_path, "w") as out:
            self.processes[name] = subprocess.Popen(cmd, env=env, stdout=out,
                                                    stderr=subprocess.STDOUT,
                                                    start_new_session=True)

    def healthcheck(self, name, service, services):
        test = list(service.get("healthcheck", {}).get("test", []))
        if not test or test[0] not in ("CMD", "CMD-SHELL"):
            raise AssertionError(f"{name}: no runnable health check")
        mounts = self.mounts(name, service)  # e.g. the CA that curl trusts
        cmd = [self.remap_value(name, t, services, mounts) for t in test[1:]]
        if test[0] == "CMD-SHELL":
            cmd = ["sh", "-c", " ".join(cmd)]
        deadline = time.time() + 90
        while time.time() < deadline:
            if self.processes[name].poll() is not None:
                raise AssertionError(f"{name} exited with {self.processes[name].returncode}:\n"
                                     + open(self.logs[name]).read()[-3000:])
            if subprocess.run(cmd, capture_output=True).returncode == 0:
                log(f"healthy {name}: {' '.join(cmd)}")
                return
            time.sleep(0.3)
        raise AssertionError(f"{name}: health check {' '.join(cmd)} never passed:\n"
                             + open(self.logs[name]).read()[-3000:])

    def stop(self):
        for name, p in self.processes.items():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in self.processes.items():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def start_order(services):
    order, seen = [], set()

    def visit(name):
        if name in seen:
            return
        seen.add(name)
        depends = services[name].get("depends_on") or {}
        for dep in (depends if isinstance(depends, (list, dict)) else []):
            if dep in services:
                visit(dep)
        order.append(name)
    for name in services:
        visit(name)
    return order


def http_json(url, data=None, token=None, ca_file=None):
    request = urllib.request.Request(url, data=data)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    with urllib.request.urlopen(request, timeout=10, context=context) as r:
        return json.loads(r.read().decode())


def run_prometheus(topology, config, services, tmp):
    """Starts Prometheus with the compose config, targets remapped."""
    prom = config["services"]["prometheus"]
    prom_args = argv(prom)
    config_path = flag(prom_args, "config.file")
    host_dir = [src for src, target in volumes(prom) if config_path.startswith(target)][0]
    with open(os.path.join(host_dir, os.path.basename(config_path))) as f:
        prom_config = yaml.safe_load(f)
    prom_config["global"]["scrape_interval"] = "1s"
    prom_config["global"]["evaluation_interval"] = "1s"
    prom_config["rule_files"] = [os.path.join(host_dir, r) for r in prom_config["rule_files"]]
    prom_mounts = topology.mounts("prometheus", prom)
    for job in prom_config["scrape_configs"]:
        auth = job.get("authorization", {})
        if "credentials_file" in auth:
            auth["credentials_file"] = topology.remap_value(
                "prometheus", auth["credentials_file"], services, prom_mounts)
        tls = job.get("tls_config", {})
        if "ca_file" in tls:
            tls["ca_file"] = topology.remap_value(
                "prometheus", tls["ca_file"], services, prom_mounts)
        static = []
        for c in job.pop("static_configs", []):
            static.append({"targets": [topology.remap_value("prometheus", t, services, {})
                                       for t in c["targets"]]})
        for c in job.pop("dns_sd_configs", []):
            for name in c["names"]:
                if name in services:   # a name of a stopped profile: no target
                    static.append({"targets": [f"127.0.0.1:{topology.port(name, c['port'])}"],
                                   "labels": {"__meta_dns_name": name}})
        job["static_configs"] = static
        # Compose scrapes workers by their service names (the address
        # relabelled from the DNS name, for the TLS name check); here the
        # names are loopback ports already, so that rewrite is left out.
        # The real engine's test (docker_compose_test.sh) covers it.
        if "relabel_configs" in job:
            job["relabel_configs"] = [r for r in job["relabel_configs"]
                                      if r.get("target_label") != "__address__"]
    path = os.path.join(tmp, "prometheus.yml")
    with open(path, "w") as f:
        yaml.safe_dump(prom_config, f)
    port = topology.port("prometheus", list(published_ports(prom))[0])
    cmd = ["prometheus", f"--config.file={path}", f"--storage.tsdb.path={tmp}/prometheus-data",
           f"--web.listen-address=127.0.0.1:{port}"]
    log(f"start prometheus: {' '.join(cmd)}")
    log_path = os.path.join(tmp, "prometheus.log")
    topology.logs["prometheus"] = log_path
    with open(log_path, "w") as out:
        topology.processes["prometheus"] = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return f"http://127.0.0.1:{port}"


def wait_for_targets(url, problems):
    """Every pipetrain target up (before the job, so scrapes cover it)."""
    deadline = time.time() + 60
    targets = []
    while time.time() < deadline:
        try:
            targets = http_json(f"{url}/api/v1/targets")["data"]["activeTargets"]
            if targets and all(t["health"] == "up" for t in targets
                               if t["labels"]["job"].startswith("pipetrain")):
                break
        except OSError:
            pass
        time.sleep(0.5)
    jobs = {(t["labels"]["job"], t["labels"].get("instance")): t["health"] for t in targets}
    log(f"prometheus targets: {jobs}")
    for (job, instance), health in jobs.items():
        if job.startswith("pipetrain") and health != "up":
            problems.append(f"prometheus: target {job} {instance} is {health}")
    if not any(j == "pipetrain-worker" for j, _ in jobs):
        problems.append("prometheus: no worker targets")


def check_prometheus(url, since, problems):
    """Rules healthy; every dashboard query runs over [since, now], the core
    ones with data (as the dashboard would show the job)."""
    time.sleep(3)   # the last scrapes of the job
    rules = http_json(f"{url}/api/v1/rules")["data"]["groups"]
    for g in rules:
        for r in g["rules"]:
            if r.get("health") != "ok":
                problems.append(f"prometheus: rule {r['name']} is {r.get('health')}: "
                                f"{r.get('lastError')}")
    with open(os.path.join(ROOT, "deploy/grafana/dashboards/pipetrain.json")) as f:
        dashboard = json.load(f)
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            # Grafana's $__rate_interval for a 1 s scrape interval.
            expr = target["expr"].replace("$__rate_interval", "4s")
            query = urllib.parse.urlencode({"query": expr, "start": since, "end": time.time(),
                                            "step": "1s"})
            try:
                answer = http_json(f"{url}/api/v1/query_range?{query}")
            except OSError as e:
                problems.append(f"dashboard {panel['title']!r}: query failed: {e}")
                continue
            result = answer.get("data", {}).get("result", [])
            if answer.get("status") != "success":
                problems.append(f"dashboard {panel['title']!r}: {answer}")
            elif target["refId"] == "A" and panel["title"] in MUST_HAVE_DATA and not result:
                problems.append(f"dashboard {panel['title']!r}: no data for {expr}")
    log(f"prometheus: {sum(len(g['rules']) for g in rules)} rules checked, "
        f"dashboard queries run")


def main(bin_dir):
    if shutil.which("docker-compose") is None or shutil.which("curl") is None or \
            shutil.which("prometheus") is None:
        print("FAIL: docker-compose, curl or prometheus is missing (run deploy/setup.sh)")
        return 1
    config = resolved_config(COMPOSE)            # the default profile
    tools = resolved_config(COMPOSE, ["tools"])  # + the ctl service
    services = {n: s for n, s in config["services"].items()
                if argv(s) and argv(s)[0].startswith("pipetrain")}
    if "scheduler" not in services or sum(1 for s in services.values()
                                         if argv(s)[0] == "pipetrain-worker") < 2:
        print(f"FAIL: the default profile runs {sorted(services)}, want a scheduler "
              "and at least two workers")
        return 1
    problems = []
    tmp = tempfile.mkdtemp(prefix="pipetrain-compose-")
    topology = Topology(bin_dir, tmp)
    try:
        # One-shot services first (the pki maker: certificates and tokens).
        for name, s in config["services"].items():
            if s.get("restart") == "no" and name not in services:
                topology.run_init(name, s, config["services"])
        token_file = os.path.join(tmp, "volume_pki", "viewer.token")
        token = open(token_file).read().strip() if os.path.exists(token_file) else None
        # The scheduler's REST port is HTTPS with the compose CA.
        ca_file = os.path.join(tmp, "volume_pki", "ca.crt")
        for name in start_order(services):
            topology.start(name, services[name], config["services"])
            topology.healthcheck(name, services[name], config["services"])

        # Workers registered under their compose names, advertising them.
        sched_http = topology.port("scheduler", flag(argv(services["scheduler"]), "http_port"))
        deadline = time.time() + 30
        listed = []
        want = {n for n, s in services.items() if argv(s)[0] == "pipetrain-worker"}
        while time.time() < deadline:
            listed = http_json(f"https://127.0.0.1:{sched_http}/v1/workers",
                               token=token, ca_file=ca_file).get("workers", [])
            if {w["id"] for w in listed if w.get("state") == "WORKER_STATE_IDLE"} >= want:
                break
            time.sleep(0.3)
        ids = {w["id"]: w for w in listed}
        for name in want:
            w = ids.get(name)
            if w is None or w.get("state") != "WORKER_STATE_IDLE":
                problems.append(f"worker {name} is not registered and idle: {w}")
        if problems:
            return report(problems, topology)

        # The compose ctl service submits a short version of the example job.
        with open(os.path.join(ROOT, "examples/fashion_mnist_mlp.job.json")) as f:
            job = json.load(f)
        job.update({"steps": 300, "epochs": 0})
        job_file = os.path.join(tmp, "short.job.json")
        with open(job_file, "w") as f:
            json.dump(job, f)
        ctl = dict(tools["services"]["ctl"])
        ctl["command"] = ["submit", job_file, "--watch", f"--stages={len(want)}"]
        cmd, env = topology.command("ctl", ctl, config["services"])
        prom_url = run_prometheus(topology, config, config["services"], tmp)
        wait_for_targets(prom_url, problems)
        since = time.time()
        log(f"run ctl: PIPETRAIN_SCHEDULER={env.get('PIPETRAIN_SCHEDULER')} {' '.join(cmd)}")
        ctl_proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = ctl_proc.communicate(timeout=400)
        except subprocess.TimeoutExpired:
            ctl_proc.kill()
            out, _ = ctl_proc.communicate()
            problems.append("pipetrainctl submit --watch did not finish in 400 s")
        log(out[-1500:])
        if ctl_proc.returncode != 0:
            problems.append(f"pipetrainctl submit --watch exited {ctl_proc.returncode}")
        jobs = http_json(f"https://127.0.0.1:{sched_http}/v1/jobs", token=token,
                         ca_file=ca_file).get("jobs", [])
        done = [j for j in jobs if j.get("state") == "JOB_STATE_COMPLETED" and
                int(j.get("step", 0)) == 300]
        if len(done) != 1:
            problems.append(f"no completed 300-step job: {jobs}")
        else:
            log(f"job {done[0]['id']} completed at step {done[0]['step']}, "
                f"loss {done[0].get('loss')}")
        check_prometheus(prom_url, since, problems)
        return report(problems, topology)
    except AssertionError as e:
        problems.append(str(e))
        return report(problems, topology)
    finally:
        topology.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def report(problems, topology):
    for p in problems:
        print(f"FAIL: {p}")
    if problems:
        for name, path in topology.logs.items():
            try:
                print(f"---- {name} log (tail)\n{open(path).read()[-2000:]}")
            except OSError:
                pass
        return 1
    print("OK: the compose topology trained a job to completion")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(os.path.abspath(sys.argv[1])))
