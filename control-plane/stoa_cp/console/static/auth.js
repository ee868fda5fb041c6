// Sign-in with the authorization code flow and PKCE (RFC 7636, S256) at the CP's configured issuer.
// The token lives in this tab's sessionStorage only; the role and tenant read from it serve the
// display alone: the CP decides every call by the token it verifies.

const SESSION = "stoa.console.session";
const PENDING = "stoa.console.pending";

function b64url(bytes) {
  let text = "";
  for (const b of new Uint8Array(bytes)) text += String.fromCharCode(b);
  return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function random(n) {
  return b64url(crypto.getRandomValues(new Uint8Array(n)));
}

function claimsOf(token) {
  const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
  const json = new TextDecoder().decode(Uint8Array.from(atob(part), (c) => c.charCodeAt(0)));
  return JSON.parse(json);
}

export async function loadConfig() {
  const reply = await fetch("/console/config.json");
  return reply.json();
}

async function discovery(config) {
  const reply = await fetch(`${config.issuer.replace(/\/$/, "")}/.well-known/openid-configuration`);
  if (!reply.ok) throw new Error(`the identity provider answered ${reply.status}`);
  return reply.json();
}

function redirectUri() {
  return `${location.origin}/console/callback`;
}

export function session() {
  const raw = sessionStorage.getItem(SESSION);
  if (!raw) return null;
  const s = JSON.parse(raw);
  if (s.exp && s.exp * 1000 <= Date.now()) {
    sessionStorage.removeItem(SESSION);
    return null;
  }
  return s;
}

export function signOut() {
  sessionStorage.removeItem(SESSION);
}

export async function signIn(config) {
  if (!config.issuer) throw new Error("this control plane names no issuer to sign in with");
  const provider = await discovery(config);
  const verifier = random(32);
  const challenge = b64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
  const state = random(16);
  sessionStorage.setItem(
    PENDING,
    JSON.stringify({ verifier, state, token_endpoint: provider.token_endpoint, back: location.hash || "#/" }),
  );
  const query = new URLSearchParams({
    response_type: "code",
    client_id: config.client_id,
    redirect_uri: redirectUri(),
    scope: "openid",
    state,
    code_challenge: challenge,
    code_challenge_method: "S256",
  });
  location.assign(`${provider.authorization_endpoint}?${query}`);
}

// On /console/callback: check the state, redeem the code with the verifier, keep the token.
export async function completeSignIn(config) {
  const params = new URLSearchParams(location.search);
  const pending = JSON.parse(sessionStorage.getItem(PENDING) || "null");
  sessionStorage.removeItem(PENDING);
  // The code leaves the address bar (and the history) whatever happens next.
  history.replaceState(null, "", `/console${pending ? pending.back : "#/"}`);
  if (params.get("error")) throw new Error(`the identity provider refused the sign-in: ${params.get("error")}`);
  if (!pending || params.get("state") !== pending.state) throw new Error("this sign-in was not started here");
  const reply = await fetch(pending.token_endpoint, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({
      grant_type: "authorization_code",
      code: params.get("code") || "",
      redirect_uri: redirectUri(),
      client_id: config.client_id,
      code_verifier: pending.verifier,
    }),
  });
  const body = await reply.json();
  if (!reply.ok) throw new Error(`the code could not be redeemed: ${body.error || reply.status}`);
  const claims = claimsOf(body.access_token);
  const roles = [].concat(claims[config.roles_claim] || []);
  const role = ["platform_admin", "tenant_admin", "viewer"].find((r) => roles.includes(r)) || "none";
  const s = { token: body.access_token, sub: claims.sub, role, tenant: claims[config.tenant_claim] || null, exp: claims.exp };
  sessionStorage.setItem(SESSION, JSON.stringify(s));
  return s;
}
