"""Reading deploy/docker-compose.yml the way Docker Compose does: through
`docker-compose config`, which validates the file, applies the profiles and
interpolates ${VARIABLES}. Shared by check_compose.py and
compose_topology_test.py."""
import os
import re
import subprocess

import yaml


def resolved_config(compose_file, profiles=(), env=None):
    """The file as `docker-compose config` resolves it, as a dict."""
    command = ["docker-compose", "-f", compose_file]
    for p in profiles:
        command += ["--profile", p]
    run_env = dict(os.environ)
    # Defaults in the file apply, not whatever the caller's shell has set.
    for key in list(run_env):
        if key.startswith(("PIPETRAIN_", "GRAFANA_", "PROMETHEUS_", "COMPOSE_")):
            del run_env[key]
    # The file insists on a Grafana password; any will do to resolve it.
    run_env["GRAFANA_ADMIN_PASSWORD"] = "resolve-only"
    run_env.update(env or {})
    out = subprocess.run(command + ["config"], capture_output=True, text=True,
                         env=run_env, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"docker-compose config failed:\n{out.stderr}")
    config = yaml.safe_load(out.stdout)
    # Some Compose versions print the services of inactive profiles too.
    config["services"] = {
        name: s for name, s in config["services"].items()
        if not s.get("profiles") or set(s["profiles"]) & set(profiles)}
    return config


def volumes(service):
    """[(source, target)] of a service, short or long syntax."""
    result = []
    for v in service.get("volumes", []):
        if isinstance(v, str):
            parts = v.split(":")
            result.append((parts[0], parts[1] if len(parts) > 1 else parts[0]))
        else:
            result.append((v.get("source"), v.get("target")))
    return result


def published_ports(service):
    """{container port: host port} of a service, short or long syntax."""
    result = {}
    for p in service.get("ports", []):
        if isinstance(p, dict):
            result[int(p["target"])] = int(p.get("published", 0) or 0)
        else:
            parts = str(p).split(":")
            result[int(parts[-1].split("/")[0])] = int(parts[-2]) if len(parts) > 1 else 0
    return result


def argv(service):
    """The command line a service's container runs (entrypoint + command)."""
    def as_list(x):
        if x is None:
            return []
        return x if isinstance(x, list) else x.split()
    return as_list(service.get("entrypoint")) + as_list(service.get("command"))


def flag(args, name):
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return values[-1] if values else None


def binary_flags(binary):
    out = subprocess.run([binary, "--helpfull"], capture_output=True, text=True,
                         timeout=30)
    return set(re.findall(r"^\s+--([a-zA-Z0-9_]+) ", out.stdout + out.stderr, re.M))


def healthcheck_url(service):
    test = service.get("healthcheck", {}).get("test", [])
    urls = [t for t in test if isinstance(t, str) and t.startswith("http")]
    return urls[0] if urls else None


def is_pipetrain(service):
    args = argv(service)
    return bool(args) and args[0].startswith("pipetrain")
