// The CP API as the console calls it: the signed-in person's token, problems as exceptions that
// keep the problem's field messages.
import { session, signOut } from "./auth.js";

export class Problem extends Error {
  constructor(status, body) {
    super(body.detail || body.title || `HTTP ${status}`);
    this.status = status;
    this.title = body.title || `HTTP ${status}`;
    this.errors = Array.isArray(body.errors) ? body.errors : [];
  }
}

export class SignedOut extends Error {}

export async function call(method, path, body) {
  const s = session();
  if (!s) throw new SignedOut("You are signed out.");
  const headers = { authorization: `Bearer ${s.token}` };
  if (body !== undefined) headers["content-type"] = "application/json";
  const reply = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (reply.status === 401) {
    signOut();
    throw new SignedOut("Your sign-in has expired or was refused: sign in again.");
  }
  if (!reply.ok) {
    let problem = { title: reply.statusText };
    try {
      problem = await reply.json();
    } catch {
      // not a problem body: the status says enough
    }
    throw new Problem(reply.status, problem);
  }
  return reply.status === 204 ? null : reply.json();
}

export const get = (path) => call("GET", path);

let spec = null;
// The CP's own OpenAPI document: which resources this CP offers, and their fields.
export async function openapi() {
  if (!spec) spec = await (await fetch("/openapi.json")).json();
  return spec;
}
