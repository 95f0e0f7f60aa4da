#!/usr/bin/env node
// Proves that validate.mjs catches the mistakes it exists for: it plants
// one mistake at a time in a copy of a render of the chart with the GPU
// values (which hold every kind the chart makes) and requires each to be
// reported at its field path. The unchanged render must be valid, and a
// mistake whose text is not found in the render fails the test rather than
// passing unseen.
//
//   node selftest.mjs GPU_RENDER.yaml
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { modulesPresent, modulesDir } from "./schemas.mjs";
import { validateText } from "./validate.mjs";

const STS = "kind: StatefulSet";
const MISTAKES = [
  // [what, anchor, text after the anchor, replacement, path, message]
  ["wrong field name", STS, "imagePullPolicy:", "imagePullpolicy:",
    "/spec/template/spec/containers/0/imagePullpolicy", "unknown field"],
  ["quoted containerPort", STS, "containerPort: 7100", 'containerPort: "7100"',
    "/spec/template/spec/containers/0/ports/0/containerPort", "must be integer"],
  ["probe field typo", STS, "periodSeconds: 2", "periodSecond: 2",
    "/spec/template/spec/containers/0/startupProbe/periodSecond", "unknown field"],
  ["probe handler typo", STS, "startupProbe:\n            httpGet:", "startupProbe:\n            httpGett:",
    "/spec/template/spec/containers/0/startupProbe/httpGett", "unknown field"],
  ["probe with two handlers", STS, "livenessProbe:\n",
    "livenessProbe:\n            tcpSocket:\n              port: grpc\n",
    "/spec/template/spec/containers/0/livenessProbe", "exactly one handler"],
  ["null pod annotations", STS, "  template:\n    metadata:\n",
    "  template:\n    metadata:\n      annotations:\n",
    "/spec/template/metadata/annotations", "null value"],
  ["duplicate key", STS, "  serviceName: pipetrain-worker\n",
    "  serviceName: pipetrain-worker\n  serviceName: pipetrain-worker\n",
    "/", "Map keys must be unique"],
  ["containerPort out of range", STS, "containerPort: 9100", "containerPort: 91000",
    "/spec/template/spec/containers/0/ports/1/containerPort", "must be 1-65535"],
  ["invalid port name", STS, "- name: metrics\n", "- name: metrics_port\n",
    "/spec/template/spec/containers/0/ports/1/name", "IANA service name"],
  ["GPU request above its limit", STS, "            requests:\n",
    "            requests:\n              nvidia.com/gpu: 2\n",
    "/spec/template/spec/containers/0/resources/requests/nvidia.com/gpu", "must equal its limit"],
  ["fractional GPU", STS, "nvidia.com/gpu: 1", "nvidia.com/gpu: 500m",
    "/spec/template/spec/containers/0/resources/limits/nvidia.com/gpu", "whole number"],
  ["serviceName of no Service", STS, "serviceName: pipetrain-worker", "serviceName: pipetrain-workers",
    "/spec/serviceName", "no Service pipetrain-workers"],
  ["memory request above its limit", "kind: Deployment", "memory: 256Mi", "memory: 2Gi",
    "/spec/template/spec/containers/0/resources/requests/memory", "less than or equal"],
  ["quoted Service port", "kind: Service\n", "port: 7000", 'port: "7000"',
    "/spec/ports/0/port", "must be integer"],
  ["targetPort no pod has", "kind: Service\n", "targetPort: http", "targetPort: https",
    "/spec/ports/1/targetPort", "has no container port https"],
  ["ServiceMonitor port no Service has", "kind: ServiceMonitor", "- port: http", "- port: https",
    "/spec/endpoints/0/port", "has no port named https"],
  ["unknown kind", "", "kind: PodDisruptionBudget", "kind: PodDisruptionBudgets",
    "/", "unknown kind PodDisruptionBudgets"],
];

// text with the first `find` after `anchor` replaced, or null if absent.
function plant(text, anchor, find, replacement) {
  const start = text.indexOf(anchor);
  const at = start < 0 ? -1 : text.indexOf(find, start);
  if (at < 0) return null;
  return text.slice(0, at) + replacement + text.slice(at + find.length);
}

async function main(file) {
  if (!modulesPresent()) {
    console.error(`no Kubernetes schemas in ${modulesDir}: run deploy/setup.sh`);
    return 2;
  }
  const render = readFileSync(file, "utf8");
  let failed = 0;
  const base = await validateText(render);
  if (base.violations.length) {
    console.log(`FAIL  the unchanged render is not valid:\n      ${base.violations.join("\n      ")}`);
    return 1;
  }
  for (const [what, anchor, find, replacement, path, message] of MISTAKES) {
    const broken = plant(render, anchor, find, replacement);
    const { violations } = broken === null ? { violations: [] } : await validateText(broken);
    const caught = violations.some((v) => v.includes(`: ${path}: `) && v.includes(message));
    if (caught) {
      console.log(`ok    caught: ${what} (${path})`);
      continue;
    }
    failed++;
    console.log(broken === null
      ? `FAIL  ${what}: ${JSON.stringify(find)} not found after ${JSON.stringify(anchor)}`
      : `FAIL  ${what}: no "${message}" at ${path}; reported:\n      ${
        violations.join("\n      ") || "nothing"}`);
  }
  return failed ? 1 : 0;
}

if (process.argv.length !== 3) {
  console.error("usage: selftest.mjs GPU_RENDER.yaml");
  process.exitCode = 2;
} else {
  process.exitCode = await main(process.argv[2]);
}
