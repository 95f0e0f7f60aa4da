// Rules of the Kubernetes API server's validation that its OpenAPI schemas
// do not carry (k8s.io/kubernetes pkg/apis/core/validation and
// apimachinery's validation): object and label names, port ranges and
// names, exactly one probe handler, requests within limits, extended
// resources (nvidia.com/gpu) whole and requested as much as their limit,
// and a workload's selector matching its own pod template. Each check
// returns [{path, message}] with JSON-pointer paths into the object.
import { parseQuantity } from "./quantity.mjs";

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const DNS1035_LABEL = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;
const QUALIFIED_NAME = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
const PROBE_HANDLERS = ["exec", "httpGet", "tcpSocket", "grpc"];
const PROBE_COUNTS = [
  "initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold", "failureThreshold",
];
const WORKLOAD_KINDS = new Set(["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"]);

// A violation at a JSON-pointer path.
export const at = (path, message) => ({ path, message });
const isLabel = (s) => typeof s === "string" && s.length <= 63 && DNS_LABEL.test(s);
const isSubdomain = (s) => typeof s === "string" && s.length <= 253 && DNS_SUBDOMAIN.test(s);

// IANA_SVC_NAME: what a port may be called (and referred to by name).
export function isPortName(s) {
  return typeof s === "string" && s.length >= 1 && s.length <= 15 && /^[-a-z0-9]+$/.test(s) &&
    /[a-z]/.test(s) && !s.includes("--") && !s.startsWith("-") && !s.endsWith("-");
}

export const isPortNumber = (p) => Number.isInteger(p) && p >= 1 && p <= 65535;

function qualifiedKeyProblem(key) {
  const parts = key.split("/");
  if (parts.length > 2) return "more than one '/'";
  const name = parts[parts.length - 1];
  if (parts.length === 2 && !isSubdomain(parts[0])) return "prefix is not a DNS subdomain";
  if (name.length > 63 || !QUALIFIED_NAME.test(name)) return "name part is not a qualified name";
  return null;
}

function checkMetadata(obj) {
  const out = [];
  const meta = obj.metadata || {};
  const dns1035 = obj.kind === "Service";
  const name = meta.name;
  if (dns1035 ? !(isLabel(name) && DNS1035_LABEL.test(name)) : !isSubdomain(name)) {
    out.push({
      path: "/metadata/name",
      message: `${JSON.stringify(name)} is not a DNS-${dns1035 ? "1035 label" : "1123 subdomain"}`,
    });
  }
  for (const [key, value] of Object.entries(meta.labels || {})) {
    const problem = qualifiedKeyProblem(key);
    if (problem) out.push(at(`/metadata/labels/${key}`, `label key: ${problem}`));
    if (typeof value === "string" && value !== "" && (value.length > 63 || !QUALIFIED_NAME.test(value))) {
      out.push(at(`/metadata/labels/${key}`, `invalid label value ${JSON.stringify(value)}`));
    }
  }
  for (const key of Object.keys(meta.annotations || {})) {
    const problem = qualifiedKeyProblem(key);
    if (problem) out.push(at(`/metadata/annotations/${key}`, `annotation key: ${problem}`));
  }
  return out;
}

function checkProbe(probe, path, kind, portNames) {
  const out = [];
  const handlers = PROBE_HANDLERS.filter((h) => probe[h] !== undefined && probe[h] !== null);
  if (handlers.length !== 1) {
    out.push({
      path,
      message: `must have exactly one handler of ${PROBE_HANDLERS.join(", ")} (has ${handlers.length})`,
    });
  }
  for (const field of PROBE_COUNTS) {
    if (Number.isInteger(probe[field]) && probe[field] < 0) {
      out.push(at(`${path}/${field}`, "must be non-negative"));
    }
  }
  if (kind !== "readinessProbe" && probe.successThreshold !== undefined && probe.successThreshold !== 1) {
    out.push(at(`${path}/successThreshold`, `must be 1 for a ${kind}`));
  }
  if (probe.grpc && !isPortNumber(probe.grpc.port)) {
    out.push(at(`${path}/grpc/port`, "must be a port number 1-65535"));
  }
  for (const h of ["httpGet", "tcpSocket"]) {
    const port = probe[h] && probe[h].port;
    if (probe[h] && !isPortNumber(port) && !(isPortName(port) && portNames.has(port))) {
      out.push(at(`${path}/${h}/port`, "must be 1-65535 or the name of a container port"));
    }
  }
  return out;
}

function checkPorts(ports, path) {
  const out = [];
  const names = new Set();
  ports.forEach((port, i) => {
    if (!isPortNumber(port.containerPort)) {
      out.push(at(`${path}/${i}/containerPort`, "must be 1-65535"));
    }
    if (port.name !== undefined) {
      if (!isPortName(port.name)) {
        const name = JSON.stringify(port.name);
        out.push(at(`${path}/${i}/name`,
          `${name} is not an IANA service name (<= 15 lowercase letters, digits, '-')`));
      } else if (names.has(port.name)) {
        out.push(at(`${path}/${i}/name`, `duplicate port name ${port.name}`));
      }
      names.add(port.name);
    }
  });
  return out;
}

// Extended resources (vendor-domain names such as nvidia.com/gpu) cannot be
// overcommitted: whole numbers, a limit, and a request equal to it if any.
const isExtended = (name) =>
  name.includes("/") && !name.startsWith("kubernetes.io/") && !name.startsWith("requests.");

function checkResources(res, path) {
  const out = [];
  const limits = res.limits || {};
  const requests = res.requests || {};
  for (const [side, map] of [["limits", limits], ["requests", requests]]) {
    for (const [name, q] of Object.entries(map)) {
      const v = parseQuantity(q);
      if (v === null) {
        out.push(at(`${path}/${side}/${name}`, `${JSON.stringify(q)} is not a quantity`));
      } else if (isExtended(name) && !Number.isInteger(v)) {
        out.push(at(`${path}/${side}/${name}`, "an extended resource must be a whole number"));
      }
    }
  }
  for (const [name, q] of Object.entries(requests)) {
    const req = parseQuantity(q);
    const lim = name in limits ? parseQuantity(limits[name]) : null;
    if (isExtended(name) && !(name in limits)) {
      out.push(at(`${path}/limits/${name}`, "an extended resource needs a limit"));
    } else if (isExtended(name) && req !== null && lim !== null && req !== lim) {
      out.push(at(`${path}/requests/${name}`,
        `must equal its limit (${limits[name]}) for an extended resource`));
    } else if (req !== null && lim !== null && req > lim) {
      out.push(at(`${path}/requests/${name}`,
        `must be less than or equal to its limit (${limits[name]})`));
    }
  }
  return out;
}

function checkContainer(c, path, volumeNames) {
  const out = [];
  if (!isLabel(c.name)) out.push(at(`${path}/name`, "not a DNS-1123 label"));
  const ports = Array.isArray(c.ports) ? c.ports : [];
  out.push(...checkPorts(ports, `${path}/ports`));
  const portNames = new Set(ports.map((p) => p.name).filter(Boolean));
  for (const kind of ["livenessProbe", "readinessProbe", "startupProbe"]) {
    if (c[kind]) out.push(...checkProbe(c[kind], `${path}/${kind}`, kind, portNames));
  }
  if (c.resources) out.push(...checkResources(c.resources, `${path}/resources`));
  (c.volumeMounts || []).forEach((m, i) => {
    if (!volumeNames.has(m.name)) {
      out.push(at(`${path}/volumeMounts/${i}/name`, `no volume named ${m.name} in the pod`));
    }
  });
  return out;
}

function checkPodSpec(spec, path) {
  const out = [];
  const volumeNames = new Set();
  (spec.volumes || []).forEach((v, i) => {
    if (!isLabel(v.name)) out.push(at(`${path}/volumes/${i}/name`, "not a DNS-1123 label"));
    if (volumeNames.has(v.name)) {
      out.push(at(`${path}/volumes/${i}/name`, "duplicate volume name"));
    }
    volumeNames.add(v.name);
  });
  const names = new Set();
  for (const list of ["initContainers", "containers"]) {
    (spec[list] || []).forEach((c, i) => {
      if (names.has(c.name)) {
        out.push(at(`${path}/${list}/${i}/name`, "duplicate container name"));
      }
      names.add(c.name);
      out.push(...checkContainer(c, `${path}/${list}/${i}`, volumeNames));
    });
  }
  return out;
}

// The pod template of a workload: {path, labels, spec}, or null.
export function podTemplate(obj) {
  if (obj.kind === "Pod") {
    return { path: "/spec", labels: (obj.metadata || {}).labels || {}, spec: obj.spec || {} };
  }
  if (!WORKLOAD_KINDS.has(obj.kind)) return null;
  const template = (obj.spec || {}).template || {};
  return {
    path: "/spec/template/spec",
    labels: (template.metadata || {}).labels || {},
    spec: template.spec || {},
  };
}

export function selects(matchLabels, labels) {
  return Object.entries(matchLabels || {}).every(([k, v]) => labels[k] === v);
}

function checkSelector(obj, pod) {
  const selector = (obj.spec || {}).selector;
  if (obj.kind === "Pod" || obj.kind === "Job" || !selector) return [];
  if (!selector.matchLabels && !selector.matchExpressions) {
    return [at("/spec/selector", "empty selector")];
  }
  if (!selects(selector.matchLabels, pod.labels)) {
    return [at("/spec/selector/matchLabels", "does not match the pod template's labels")];
  }
  return [];
}

function checkService(svc) {
  const out = [];
  const ports = (svc.spec || {}).ports || [];
  const names = new Set();
  ports.forEach((p, i) => {
    const path = `/spec/ports/${i}`;
    if (!isPortNumber(p.port)) out.push(at(`${path}/port`, "must be 1-65535"));
    const t = p.targetPort;
    if (t !== undefined && !isPortNumber(t) && !isPortName(t)) {
      out.push(at(`${path}/targetPort`, "must be 1-65535 or an IANA port name"));
    }
    if (ports.length > 1 && !p.name) {
      out.push(at(`${path}/name`, "required when a Service has more than one port"));
    }
    if (p.name && names.has(p.name)) out.push(at(`${path}/name`, "duplicate port name"));
    names.add(p.name);
  });
  return out;
}

function checkPdb(pdb) {
  const spec = pdb.spec || {};
  if (spec.minAvailable !== undefined && spec.maxUnavailable !== undefined) {
    return [at("/spec", "minAvailable and maxUnavailable cannot both be set")];
  }
  return [];
}

// The API server's rules for one object.
export function checkRules(obj) {
  const out = checkMetadata(obj);
  const pod = podTemplate(obj);
  if (pod) {
    out.push(...checkPodSpec(pod.spec, pod.path));
    out.push(...checkSelector(obj, pod));
  }
  if (obj.kind === "Service") out.push(...checkService(obj));
  if (obj.kind === "PodDisruptionBudget") out.push(...checkPdb(obj));
  return out;
}
