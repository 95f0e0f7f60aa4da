// Strict validation of one Kubernetes object against the API's schemas from
// the npm packages kubernetes-models and @kubernetes-models/prometheus-operator
// (installed by deploy/setup.sh into .tools/kube, pinned by package-lock.json).
//
// The packages ship compiled validators (ajv) that check types, formats,
// enums and required fields but, like the published OpenAPI schemas, accept
// unknown fields: the API server drops those silently, so a misspelled key
// (periodSecond, imagePullpolicy) disappears without a word. Every object is
// therefore validated through a Proxy that records which keys the validator
// reads: the compiled code reads each property its schema declares (and
// iterates the keys of maps), so a key it never read is not in the schema.
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));

// Where setup.sh installs the packages; PIPETRAIN_KUBE_MODULES overrides.
export const modulesDir =
  process.env.PIPETRAIN_KUBE_MODULES ||
  resolve(here, "../../../.tools/kube/node_modules");

export function modulesPresent() {
  return existsSync(join(modulesDir, "kubernetes-models", "package.json"));
}

// apiVersion group -> directory of its models inside the packages.
function modelDir(apiVersion) {
  if (!/^([a-z0-9.-]+\/)?v[0-9]+((alpha|beta)[0-9]+)?$/.test(apiVersion)) {
    return null;
  }
  if (apiVersion.startsWith("monitoring.coreos.com/")) {
    return join(modulesDir, "@kubernetes-models/prometheus-operator", apiVersion);
  }
  return join(modulesDir, "kubernetes-models", apiVersion);
}

const groupCache = new Map();

async function loadGroup(dir) {
  if (!groupCache.has(dir)) {
    const index = join(dir, "index.js");
    groupCache.set(
      dir,
      existsSync(index) ? await import(pathToFileURL(index).href) : null,
    );
  }
  return groupCache.get(dir);
}

// The model class of apiVersion/kind, or null when the packages have none.
export async function modelFor(apiVersion, kind) {
  const dir = typeof apiVersion === "string" ? modelDir(apiVersion) : null;
  const group = dir ? await loadGroup(dir) : null;
  if (!group) return null;
  const model = Object.values(group).find(
    (m) => typeof m === "function" && m.apiVersion === apiVersion && m.kind === kind,
  );
  return model || null;
}

// Wraps value so that every key read on it or below it is recorded in seen.
function recording(value, seen) {
  if (value === null || typeof value !== "object") return value;
  return new Proxy(value, {
    get(target, key, receiver) {
      if (typeof key === "string") {
        if (!seen.has(target)) seen.set(target, new Set());
        seen.get(target).add(key);
      }
      return recording(Reflect.get(target, key, receiver), seen);
    },
  });
}

// Keys of value (at JSON pointer path) that the validator never read.
function unreadKeys(value, path, seen, out) {
  if (value === null || typeof value !== "object") return;
  if (Array.isArray(value)) {
    value.forEach((item, i) => unreadKeys(item, `${path}/${i}`, seen, out));
    return;
  }
  const read = seen.get(value) || new Set();
  for (const key of Object.keys(value)) {
    if (read.has(key)) {
      unreadKeys(value[key], `${path}/${key}`, seen, out);
    } else {
      out.push({ path: `${path}/${key}`, message: "unknown field (not in the API schema)" });
    }
  }
}

// Nulls: the API server treats most as unset, but server-side apply and
// strategic merge patches reject or misread them; a render holds none.
function nullValues(value, path, out) {
  if (value === null) {
    out.push({ path: path || "/", message: "null value (leave the key out)" });
  } else if (Array.isArray(value)) {
    value.forEach((item, i) => nullValues(item, `${path}/${i}`, out));
  } else if (typeof value === "object") {
    for (const [k, v] of Object.entries(value)) nullValues(v, `${path}/${k}`, out);
  }
}

function schemaErrors(model, obj, seen) {
  try {
    model.prototype.validate.call(recording(obj, seen));
    return [];
  } catch (err) {
    if (!Array.isArray(err.errors)) throw err;
    return err.errors.map((e) => {
      const allowed = e.params && e.params.allowedValues;
      return {
        // JSON pointer unescaped, like the paths of the other checks.
        path: (e.instancePath || "/").replace(/~1/g, "/").replace(/~0/g, "~"),
        message: allowed ? `${e.message} (${allowed.join(", ")})` : e.message,
      };
    });
  }
}

// Violations of obj against its schema: [{path, message}], paths as JSON
// pointers into the object.
export async function checkSchema(obj) {
  const out = [];
  if (obj === null || typeof obj !== "object" || Array.isArray(obj)) {
    return [{ path: "/", message: "a manifest must be a mapping" }];
  }
  const model = await modelFor(obj.apiVersion, obj.kind);
  if (!model) {
    return [{
      path: "/",
      message: `unknown kind ${obj.kind} in apiVersion ${obj.apiVersion} (no schema)`,
    }];
  }
  const seen = new WeakMap();
  out.push(...schemaErrors(model, obj, seen));
  unreadKeys(obj, "", seen, out);
  nullValues(obj, "", out);
  return out;
}
