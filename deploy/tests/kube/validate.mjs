#!/usr/bin/env node
// Validates Kubernetes manifests (e.g. `helm template` renders) offline
// against the Kubernetes API's schemas and the API server's own rules.
//
//   node validate.mjs FILE...
//
// Every document of every FILE must be an object whose apiVersion/kind has a
// schema (an unknown kind is an error, not a skip), valid against it with no
// unknown field and no null, with no duplicate key in its YAML, obeying the
// rules of rules.mjs; the documents of one FILE form a release checked by
// release.mjs once each document is valid on its own. Prints each violation
// with its field path and exits 1 when there is one; 2 when the schema
// packages are not installed.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { checkRelease } from "./release.mjs";
import { checkRules } from "./rules.mjs";
import { checkSchema, modulesDir, modulesPresent } from "./schemas.mjs";

async function loadYaml() {
  return import(pathToFileURL(join(modulesDir, "yaml", "dist", "index.js")).href);
}

function describe(obj, index) {
  const kind = obj && obj.kind ? obj.kind : "?";
  const name = obj && obj.metadata && obj.metadata.name ? obj.metadata.name : "?";
  return `document ${index} (${kind}/${name})`;
}

// Kubernetes reads YAML 1.1 (sigs.k8s.io/yaml): `yes`/`on` are booleans.
// Duplicate keys are errors, as they are for the API server's decoder.
function parseDocuments(YAML, text) {
  const docs = YAML.parseAllDocuments(text, { version: "1.1", uniqueKeys: true });
  const out = [];
  for (const doc of docs) {
    const errors = doc.errors.map((e) => `YAML: ${e.message.split("\n")[0]}`);
    const obj = errors.length ? null : doc.toJS({ maxAliasCount: 100 });
    if (errors.length || obj !== null) out.push({ obj, errors });
  }
  return out;
}

function duplicates(objs) {
  const seen = new Map();
  const out = [];
  objs.forEach((obj, index) => {
    const meta = obj.metadata || {};
    const key = `${obj.apiVersion}/${obj.kind}/${meta.namespace || ""}/${meta.name}`;
    if (seen.has(key)) {
      out.push({ index, path: "/metadata/name", message: `same object as document ${seen.get(key)}` });
    } else {
      seen.set(key, index);
    }
  });
  return out;
}

// Violations of the manifests in text: ["document N (Kind/name): /path: message"].
export async function validateText(text) {
  const YAML = await loadYaml();
  const docs = parseDocuments(YAML, text);
  const out = [];
  const valid = [];
  for (const [index, { obj, errors }] of docs.entries()) {
    const where = describe(obj, index);
    const found = errors.length ? errors.map((e) => ({ path: "/", message: e })) : await checkSchema(obj);
    if (!errors.length) found.push(...checkRules(obj));
    out.push(...found.map((v) => `${where}: ${v.path}: ${v.message}`));
    if (!found.length) valid.push({ obj, index });
  }
  if (docs.length === 0) out.push("no Kubernetes object in the input");
  // Cross-object rules need well-formed objects; an invalid one would only
  // add echoes of its own violations (a Service selecting no pod).
  if (out.length) return { violations: out, objects: docs.length };
  const objs = valid.map((v) => v.obj);
  for (const v of [...checkRelease(objs), ...duplicates(objs)]) {
    out.push(`${describe(objs[v.index], valid[v.index].index)}: ${v.path}: ${v.message}`);
  }
  return { violations: out, objects: docs.length };
}

async function main(files) {
  if (!modulesPresent()) {
    console.error(`no Kubernetes schemas in ${modulesDir}: run deploy/setup.sh`);
    return 2;
  }
  if (files.length === 0) {
    console.error("usage: validate.mjs FILE...");
    return 2;
  }
  let failed = 0;
  for (const file of files) {
    const { violations, objects } = await validateText(readFileSync(file, "utf8"));
    if (violations.length === 0) {
      console.log(`ok    ${file}: ${objects} objects valid`);
    } else {
      failed++;
      console.log(`FAIL  ${file}: ${violations.length} violation(s)`);
      for (const v of violations) console.log(`      ${v}`);
    }
  }
  return failed ? 1 : 0;
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  process.exitCode = await main(process.argv.slice(2));
}
