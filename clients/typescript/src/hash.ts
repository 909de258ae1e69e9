import { createHash } from "node:crypto";

/**
 * The canonical JSON text of `value`: object keys sorted by UTF-16 code units (as
 * RFC 8785 sorts them), no whitespace. Two values equal as JSON hash the same.
 */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") {
    const text = JSON.stringify(value);
    if (text === undefined) throw new TypeError("arguments must be JSON values");
    return text;
  }
  if (Array.isArray(value)) {
    return `[${value.map((v) => canonicalJson(v === undefined ? null : v)).join(",")}]`;
  }
  const entries = Object.entries(value as Record<string, unknown>)
    .filter(([, v]) => v !== undefined)
    // Plain string comparison in JavaScript is by UTF-16 code units.
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
}

/** `"sha256:<64 hex>"` of the canonical JSON of `args`: what binds a card to its call. */
export function argumentsHash(args: unknown): string {
  return `sha256:${createHash("sha256").update(canonicalJson(args), "utf8").digest("hex")}`;
}
