// Rules across the objects of one release that no schema can carry: each
// Service selects pods of the release and its targetPorts are ports those
// pods have, a StatefulSet's serviceName is a headless Service of the
// release selecting its pods, and the selectors of PodDisruptionBudgets and
// ServiceMonitors match something in the release. Checks return
// [{index, path, message}], index being the object's place in objs.
import { at, podTemplate, selects } from "./rules.mjs";

function podsOf(objs) {
  return objs.map((obj) => ({ obj, pod: podTemplate(obj) })).filter((x) => x.pod);
}

function containerPorts(pod) {
  return (pod.spec.containers || []).flatMap((c) => c.ports || []);
}

function checkServicePorts(svc, selected) {
  const out = [];
  ((svc.spec || {}).ports || []).forEach((p, i) => {
    const target = p.targetPort === undefined ? p.port : p.targetPort;
    for (const { obj, pod } of selected) {
      const has = containerPorts(pod).some((cp) =>
        typeof target === "string" ? cp.name === target : cp.containerPort === target);
      if (!has) {
        out.push({
          path: `/spec/ports/${i}/targetPort`,
          message: `${obj.kind} ${obj.metadata.name} has no container port ${target}`,
        });
      }
    }
  });
  return out;
}

function checkService(svc, pods) {
  const selector = (svc.spec || {}).selector;
  if (!selector) return [];  // a Service without selector has its own endpoints
  const selected = pods.filter(({ pod }) => selects(selector, pod.labels));
  if (selected.length === 0) {
    return [at("/spec/selector", "selects no pod of the release")];
  }
  return checkServicePorts(svc, selected);
}

function checkStatefulSet(sts, services) {
  const name = (sts.spec || {}).serviceName;
  if (!name) return [];
  const svc = services.find((s) => s.metadata.name === name);
  if (!svc) return [at("/spec/serviceName", `no Service ${name} in the release`)];
  const labels = podTemplate(sts).labels;
  const out = [];
  if ((svc.spec || {}).clusterIP !== "None") {
    out.push(at("/spec/serviceName", `Service ${name} is not headless (clusterIP: None)`));
  }
  if (!selects((svc.spec || {}).selector, labels) || !(svc.spec || {}).selector) {
    out.push(at("/spec/serviceName", `Service ${name} does not select the set's pods`));
  }
  return out;
}

function checkPdb(pdb, pods) {
  const selector = (pdb.spec || {}).selector || {};
  if (!pods.some(({ pod }) => selects(selector.matchLabels, pod.labels))) {
    return [at("/spec/selector", "selects no pod of the release")];
  }
  return [];
}

function checkServiceMonitor(sm, services) {
  const selector = (sm.spec || {}).selector || {};
  const selected = services.filter((s) => selects(selector.matchLabels, (s.metadata || {}).labels || {}));
  if (selected.length === 0) {
    return [at("/spec/selector", "selects no Service of the release")];
  }
  const out = [];
  ((sm.spec || {}).endpoints || []).forEach((ep, i) => {
    if (ep.port === undefined) return;
    for (const svc of selected) {
      if (!((svc.spec || {}).ports || []).some((p) => p.name === ep.port)) {
        out.push(at(`/spec/endpoints/${i}/port`,
          `Service ${svc.metadata.name} has no port named ${ep.port}`));
      }
    }
  });
  return out;
}

// The cross-object rules of a release (objects already schema-valid).
export function checkRelease(objs) {
  const pods = podsOf(objs);
  const services = objs.filter((o) => o.kind === "Service");
  const out = [];
  objs.forEach((obj, index) => {
    let found = [];
    if (obj.kind === "Service") found = checkService(obj, pods);
    if (obj.kind === "StatefulSet") found = checkStatefulSet(obj, services);
    if (obj.kind === "PodDisruptionBudget") found = checkPdb(obj, pods);
    if (obj.kind === "ServiceMonitor") found = checkServiceMonitor(obj, services);
    out.push(...found.map((v) => ({ index, ...v })));
  });
  return out;
}
