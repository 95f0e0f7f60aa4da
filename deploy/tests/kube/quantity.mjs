// Kubernetes resource quantities ("250m", "1Gi", "1e9", 2) as numbers, for
// comparing requests with limits. Float precision is enough for that: both
// sides go through the same conversion.
const BINARY = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60 };
const DECIMAL = { n: 1e-9, u: 1e-6, m: 1e-3, "": 1, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18 };
const SYNTAX = /^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$/;

// The quantity's value, or null when it is not one the API server accepts.
export function parseQuantity(q) {
  if (typeof q === "number") return Number.isFinite(q) ? q : null;
  if (typeof q !== "string") return null;
  const m = SYNTAX.exec(q);
  if (!m) return null;
  const suffix = m[2] || "";
  const scale = BINARY[suffix] ?? DECIMAL[suffix] ?? 10 ** Number(suffix.slice(1));
  return Number(m[1]) * scale;
}
