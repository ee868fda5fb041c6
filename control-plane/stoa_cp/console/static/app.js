// The console: hash routes over the CP API. Pages for tenant resources are made from the CP's
// OpenAPI document (every `/v1/tenants/{tenant_id}/<collection>` with a list and a create), so a
// resource the CP gains (consumers, plans, subscriptions, tools) gets its page without a change here.
import { call, get, openapi, Problem, SignedOut } from "./api.js";
import { completeSignIn, loadConfig, session, signIn, signOut } from "./auth.js";
import { el, human, resolve, schemaForm, showProblem } from "./forms.js";

// Live gateway state: each shown gateway's status is read every POLL_MS while the page is visible,
// one request at a time, and only while its view is on screen.
const POLL_MS = 1000;
const TENANT_BASE = "/v1/tenants/{tenant_id}";
const ORDER = ["apis", "policies", "issuers", "consumers", "plans", "subscriptions", "tools", "tool-grants", "tool-revocations"];

let config;
let spec;
let stops = [];
const main = () => document.getElementById("main");
const enc = encodeURIComponent;

function fill(template, params) {
  return template.replace(/\{([a-z_]+)\}/g, (_, k) => enc(params[k]));
}

function announce(text) {
  const region = document.getElementById("announce");
  region.textContent = "";
  setTimeout(() => (region.textContent = text), 50);
}

function me() {
  return session();
}

const canWrite = () => me()?.role !== "viewer";
const platform = () => me()?.role === "platform_admin" || (me()?.role === "viewer" && !me()?.tenant);

// ---- what the CP offers ----------------------------------------------------------------------
function bodySchema(op) {
  return op?.requestBody?.content?.["application/json"]?.schema || null;
}

function itemSchemaOf(op) {
  const schema = resolve(spec, op?.responses?.["200"]?.content?.["application/json"]?.schema);
  return schema.type === "array" ? resolve(spec, schema.items) : schema;
}

function describe(template) {
  const ops = spec.paths[template] || {};
  const pattern = new RegExp(`^${template.replace(/[{}]/g, "\\$&")}/\\{([a-z_]+)\\}$`);
  const itemTemplate = Object.keys(spec.paths).find((p) => pattern.test(p)) || null;
  const item = itemTemplate ? spec.paths[itemTemplate] : {};
  const subs = itemTemplate
    ? Object.keys(spec.paths)
        .filter((p) => p.startsWith(`${itemTemplate}/`) && /^[a-z_-]+$/.test(p.slice(itemTemplate.length + 1)))
        .map((p) => ({ name: p.slice(itemTemplate.length + 1), template: p, ops: spec.paths[p] }))
    : [];
  return {
    template,
    name: template.split("/").pop(),
    list: ops.get,
    create: ops.post,
    createSchema: bodySchema(ops.post),
    createdSchema: ops.post ? resolve(spec, ops.post.responses?.["201"]?.content?.["application/json"]?.schema) : null,
    itemTemplate,
    idParam: itemTemplate ? itemTemplate.match(/\{([a-z_]+)\}$/)[1] : null,
    put: item.put,
    putSchema: bodySchema(item.put),
    del: item.delete,
    itemSchema: itemSchemaOf(ops.get),
    subs,
  };
}

function tenantCollections() {
  const pattern = new RegExp(`^${TENANT_BASE.replace(/[{}]/g, "\\$&")}/([a-z_-]+)$`);
  const names = Object.keys(spec.paths)
    .map((p) => p.match(pattern)?.[1])
    .filter((n) => n && spec.paths[`${TENANT_BASE}/${n}`].get && spec.paths[`${TENANT_BASE}/${n}`].post);
  const rank = (n) => (ORDER.includes(n) ? ORDER.indexOf(n) : ORDER.length);
  return names.sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

// ---- shell -----------------------------------------------------------------------------------
function currentTenant() {
  const m = location.hash.match(/^#\/t\/([^/]+)/);
  if (m) return decodeURIComponent(m[1]);
  return me()?.tenant || sessionStorage.getItem("stoa.console.tenant") || null;
}

async function renderShell() {
  const who = document.getElementById("who");
  const nav = document.getElementById("nav");
  const s = me();
  if (!s) {
    who.replaceChildren();
    nav.replaceChildren();
    return;
  }
  who.replaceChildren(
    el("span", { id: "signed-in-as", text: `${s.sub} · ${human(s.role)}${s.tenant ? ` of ${s.tenant}` : ""}` }),
    el("button", { type: "button", class: "secondary", id: "sign-out", text: "Sign out", onclick: () => { signOut(); location.hash = "#/"; route(); } }),
  );
  let tenants = [];
  try {
    tenants = await get("/v1/tenants");
  } catch (e) {
    if (e instanceof SignedOut) return;
  }
  const tenant = currentTenant();
  const links = [["#/tenants", "Tenants"]];
  if (tenant) for (const n of tenantCollections()) links.push([`#/t/${enc(tenant)}/${n}`, human(n)]);
  links.push(["#/gateways", "Gateways"]);
  const select = el(
    "select",
    { id: "tenant-select", onchange: (e) => { const page = location.hash.match(/^#\/t\/[^/]+\/([a-z_-]+)/)?.[1] || "apis"; location.hash = `#/t/${enc(e.target.value)}/${page}`; } },
    tenant ? null : el("option", { value: "", text: "—" }),
    tenants.map((t) => el("option", { value: t.tenant_id, text: t.tenant_id, selected: t.tenant_id === tenant })),
  );
  nav.replaceChildren(
    el("ul", {}, links.map(([href, text]) => el("li", {}, el("a", { href, text, "aria-current": location.hash.startsWith(href) ? "page" : null })))),
    tenants.length ? el("label", { for: "tenant-select", class: "visually-hidden", text: "Tenant" }) : null,
    tenants.length ? select : null,
  );
}

function page(title, ...children) {
  const h1 = el("h1", { tabindex: "-1", text: title });
  main().replaceChildren(h1, ...children);
  h1.focus();
}

function errorBox(e) {
  if (e instanceof Problem) {
    return el("div", { class: "alert", role: "alert" },
      el("p", { text: `${e.title} (${e.status})` }),
      el("ul", {}, e.errors.map((x) => el("li", { text: `${x.field}: ${x.message}` }))));
  }
  return el("div", { class: "alert", role: "alert", text: e.message });
}

function failed(e) {
  if (e instanceof SignedOut) {
    signedOut(e.message);
    return;
  }
  page("Something went wrong", errorBox(e));
}

function signedOut(message) {
  renderShell();
  page(
    "Sign in",
    message ? el("p", { class: "notice", role: "status", text: message }) : null,
    el("p", { text: "Sign in with your organisation's identity provider to manage tenants, APIs and gateways." }),
    el("button", { type: "button", id: "sign-in", text: "Sign in", onclick: () => signIn(config).catch((e) => page("Sign in", errorBox(e))) }),
  );
}

// ---- live gateway state ----------------------------------------------------------------------
function renderStatus(box, st) {
  const report = st.last_report;
  const rows = [
    ["Desired generation", st.desired_generation],
    ["Acknowledged generation", st.acknowledged_generation],
  ];
  if (st.state === "SYNCED" && st.snapshot_version) rows.push(["Snapshot version", st.snapshot_version]);
  if (report && (st.state === "FAILED" || report.status === "FAILED")) {
    rows.push(["Last report", `${report.status} at generation ${report.generation}`]);
    rows.push(["Reason", report.reason]);
    if (report.detail) rows.push(["Envoy's detail", report.detail]);
  }
  for (const p of st.invalid_policies || []) rows.push([`Left out: ${p.policy_id}`, p.reason]);
  box.dataset.state = st.state;
  box.replaceChildren(
    el("p", {}, el("strong", { text: st.gateway_id }), " ", el("span", { class: `state state-${st.state}`, "data-role": "state", text: st.state })),
    el("dl", {}, rows.map(([k, v]) => [el("dt", { text: k }), el("dd", { "data-role": k.toLowerCase().replace(/[^a-z]+/g, "-"), text: String(v) })])),
  );
}

function watchGateway(gatewayId) {
  const box = el("div", { class: "gateway-status", "data-gateway": gatewayId, "aria-live": "polite" }, el("p", { text: `${gatewayId}: reading…` }));
  let stopped = false;
  let timer = null;
  let last = "";
  const mine = seq;
  async function tick() {
    if (stopped || mine !== seq) return;
    if (!document.hidden) {
      try {
        const st = await get(`/v1/gateways/${enc(gatewayId)}/status`);
        const text = JSON.stringify(st);
        if (text !== last) {
          const before = box.dataset.state;
          renderStatus(box, st);
          if (before && before !== st.state) announce(`${gatewayId}: ${st.state} at generation ${st.desired_generation}`);
          last = text;
        }
      } catch (e) {
        if (e instanceof SignedOut) return failed(e);
        box.replaceChildren(errorBox(e));
        last = "";
      }
    }
    if (!stopped) timer = setTimeout(tick, POLL_MS);
  }
  tick();
  stops.push(() => {
    stopped = true;
    clearTimeout(timer);
  });
  return box;
}

// ---- a collection of resources, from the OpenAPI document --------------------------------------
function cell(value) {
  if (value === null || value === undefined) return "—";
  if (Array.isArray(value)) return value.every((v) => typeof v !== "object") ? value.join(", ") || "—" : JSON.stringify(value);
  if (typeof value === "object") {
    // A nested object as its set members (`mode: jwt; scopes: a, b`), a long one cut short.
    const parts = Object.entries(value)
      .filter(([, v]) => v !== false && v !== null && !(Array.isArray(v) && !v.length))
      .map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`);
    const text = parts.join("; ") || "—";
    return text.length > 120 ? `${text.slice(0, 117)}…` : text;
  }
  return String(value);
}

function shownOnce(desc, body) {
  const props = desc.createdSchema?.properties || {};
  const secrets = Object.entries(props).filter(([, s]) => /^Shown once/.test(s.description || ""));
  if (!secrets.length || !body) return null;
  return el("div", { class: "notice", role: "status" },
    secrets.map(([k]) => el("p", {}, `${human(k)} (shown once, copy it now): `, el("code", { "data-role": `shown-once-${k}`, text: body[k] }))));
}

async function collectionView(desc, params, { rowExtras, title, heading, mayCreate = true, subs = true } = {}) {
  const section = el("section", { class: "card", "aria-labelledby": `${desc.name}-heading` });
  const notices = el("div", {});
  const tableArea = el("div", {});
  const formArea = el("div", {});
  const refresh = async () => {
    try {
      const rows = await get(fill(desc.template, params));
      tableArea.replaceChildren(table(rows));
    } catch (e) {
      if (e instanceof SignedOut) return failed(e);
      tableArea.replaceChildren(errorBox(e));
    }
  };
  const columns = Object.keys(desc.itemSchema?.properties || {}).filter((k) => !(k in params));
  const table = (rows) => {
    if (!rows.length) return el("p", { text: `No ${human(desc.name).toLowerCase()} yet.` });
    return el("div", { class: "table-wrap" }, el("table", { id: `${desc.name}-table` },
      el("caption", { class: "visually-hidden", text: heading || human(desc.name) }),
      el("thead", {}, el("tr", {}, columns.map((c) => el("th", { scope: "col", text: human(c) })), el("th", { scope: "col", text: "Actions" }))),
      el("tbody", {}, rows.map((row) => rowOf(row)))));
  };
  const rowOf = (row) => {
    const id = desc.idParam ? row[desc.idParam] ?? row[columns[0]] : row[columns[0]];
    const itemParams = { ...params, [desc.idParam]: id };
    const actions = el("div", { class: "actions" });
    const tr = el("tr", { "data-id": id }, columns.map((c) => el("td", { "data-col": c, text: cell(row[c]) })), el("td", {}, actions));
    if (canWrite() && desc.put && desc.putSchema) {
      actions.append(el("button", { type: "button", class: "secondary", id: `edit-${id}`, text: "Edit", "aria-label": `Edit ${id}`, onclick: () => editForm(row, itemParams, id) }));
    }
    for (const sub of subs ? desc.subs : []) {
      if (sub.ops.post && !sub.ops.get && !bodySchema(sub.ops.post) && canWrite()) {
        actions.append(el("button", { type: "button", class: "secondary", text: human(sub.name), "aria-label": `${human(sub.name)} ${id}`, onclick: async () => {
          try { await call("POST", fill(sub.template, itemParams)); announce(`${human(sub.name)}: done`); notices.replaceChildren(el("p", { class: "notice", role: "status", text: `${human(sub.name)} ${id}: done` })); await refresh(); }
          catch (e) { if (e instanceof SignedOut) return failed(e); notices.replaceChildren(errorBox(e)); }
        } }));
      } else if (sub.ops.get) {
        actions.append(el("button", { type: "button", class: "secondary", text: human(sub.name), "aria-label": `${human(sub.name)} of ${id}`, onclick: () => subView(sub, itemParams, id) }));
      }
    }
    if (canWrite() && desc.del) {
      actions.append(el("button", { type: "button", class: "danger", text: "Delete", "aria-label": `Delete ${id}`, onclick: async () => {
        if (!confirm(`Delete ${id}?`)) return;
        try { await call("DELETE", fill(desc.itemTemplate, itemParams)); announce(`${id} deleted`); await refresh(); }
        catch (e) { if (e instanceof SignedOut) return failed(e); notices.replaceChildren(errorBox(e)); }
      } }));
    }
    rowExtras?.(row, actions, refresh, notices);
    return tr;
  };
  const editForm = (row, itemParams, id) => {
    const form = schemaForm(spec, `edit-${desc.name}`, desc.putSchema, {
      value: row,
      skip: [desc.idParam],
      submitLabel: `Save ${id}`,
      onSubmit: async (body, f) => {
        try {
          await call("PUT", fill(desc.itemTemplate, itemParams), body);
          announce(`${id} saved`);
          notices.replaceChildren(el("p", { class: "notice", role: "status", text: `${id} saved.` }));
          formArea.replaceChildren(createArea());
          await refresh();
        } catch (e) {
          if (e instanceof SignedOut) return failed(e);
          if (e instanceof Problem) showProblem(f, e);
          else throw e;
        }
      },
    });
    formArea.replaceChildren(el("h3", { text: `Edit ${id}` }), form,
      el("button", { type: "button", class: "secondary", text: "Cancel", onclick: () => formArea.replaceChildren(createArea()) }));
    form.querySelector("input, select, textarea")?.focus();
  };
  const subView = async (sub, itemParams, id) => {
    const inner = describe(sub.template);
    const view = await collectionView(inner, itemParams, { heading: `${human(sub.name)} of ${id}` });
    formArea.replaceChildren(view, el("button", { type: "button", class: "secondary", text: "Close", onclick: () => formArea.replaceChildren(createArea()) }));
  };
  const createArea = () => {
    if (!canWrite() || !desc.create || !mayCreate) return el("div", {});
    const formId = `new-${desc.name}`;
    if (!desc.createSchema) {
      return el("button", { type: "button", id: formId, text: `New ${human(desc.name).replace(/s$/, "")}`, onclick: async () => {
        try { const made = await call("POST", fill(desc.template, params)); notices.replaceChildren(shownOnce(desc, made) || ""); await refresh(); }
        catch (e) { if (e instanceof SignedOut) return failed(e); notices.replaceChildren(errorBox(e)); }
      } });
    }
    return el("div", {},
      el("h3", { text: `New ${human(desc.name).replace(/s$/, "").replace(/ie$/, "y")}` }),
      schemaForm(spec, formId, desc.createSchema, {
        first: [desc.idParam || Object.keys(desc.itemSchema?.properties || {})[0]],
        submitLabel: "Create",
        onSubmit: async (body, form) => {
          try {
            const made = await call("POST", fill(desc.template, params), body);
            const id = made?.[desc.idParam] ?? "";
            announce(`${id} created`);
            notices.replaceChildren(shownOnce(desc, made) || el("p", { class: "notice", role: "status", text: `${id} created.` }));
            form.reset();
            await refresh();
          } catch (e) {
            if (e instanceof SignedOut) return failed(e);
            if (e instanceof Problem) showProblem(form, e);
            else throw e;
          }
        },
      }));
  };
  section.append(el("h2", { id: `${desc.name}-heading`, text: heading || title || human(desc.name) }), notices, tableArea, formArea);
  formArea.append(createArea());
  await refresh();
  return section;
}

// ---- pages -----------------------------------------------------------------------------------
async function tenantsPage() {
  const desc = describe("/v1/tenants");
  const view = await collectionView(desc, {}, {
    mayCreate: platform(),
    rowExtras: (row, actions) => actions.append(el("a", { href: `#/t/${enc(row.tenant_id)}/apis`, text: `Open ${row.tenant_id}` })),
  });
  return ["Tenants", view];
}

async function tenantPage(tenant, name) {
  if (!tenantCollections().includes(name)) return ["Not found", el("p", { text: `This control plane has no ${name}.` })];
  sessionStorage.setItem("stoa.console.tenant", tenant);
  const desc = describe(`${TENANT_BASE}/${name}`);
  const params = { tenant_id: tenant };
  try {
    await get(fill(desc.template, params));
  } catch (e) {
    // A tenant the caller may not see is absent (404): nothing of the page is offered.
    if (e instanceof Problem && e.status === 404) return [`Tenant ${tenant}`, errorBox(e)];
    throw e;
  }
  if (name !== "apis") return [`${human(name)} of ${tenant}`, await collectionView(desc, params)];
  const gateways = await get("/v1/gateways");
  const publication = el("section", { class: "card", "aria-labelledby": "publication-heading" },
    el("h2", { id: "publication-heading", text: "Publication on gateways" }),
    gateways.length ? gateways.map((g) => watchGateway(g.gateway_id)) : el("p", { text: "No gateway is registered." }));
  const deployButtons = (row, actions, refresh, notices) => {
    if (!canWrite()) return;
    for (const g of gateways) {
      const on = row.deployed_on.includes(g.gateway_id);
      actions.append(el("button", {
        type: "button",
        id: `${on ? "undeploy" : "deploy"}-${row.api_id}-${g.gateway_id}`,
        text: on ? `Undeploy from ${g.gateway_id}` : `Deploy on ${g.gateway_id}`,
        onclick: async () => {
          try {
            const done = await call(on ? "DELETE" : "PUT", `/v1/gateways/${enc(g.gateway_id)}/deployments/${enc(row.api_id)}`);
            const what = on ? "undeployed from" : "deployed on";
            notices.replaceChildren(el("p", { class: "notice", role: "status", text: `${row.api_id} ${what} ${g.gateway_id}: generation ${done.generation}.` }));
            announce(`${row.api_id} ${what} ${g.gateway_id}, generation ${done.generation}`);
            await refresh();
          } catch (e) {
            if (e instanceof SignedOut) return failed(e);
            notices.replaceChildren(errorBox(e));
          }
        },
      }));
    }
  };
  return [`APIs of ${tenant}`, publication, await collectionView(desc, params, { rowExtras: deployButtons })];
}

async function gatewaysPage() {
  const desc = describe("/v1/gateways");
  const view = await collectionView(desc, {}, {
    mayCreate: platform(),
    subs: false,
    rowExtras: (row, actions) => actions.append(el("a", { href: `#/gateways/${enc(row.gateway_id)}`, text: `Open ${row.gateway_id}` })),
  });
  const gateways = await get("/v1/gateways");
  const live = el("section", { class: "card", "aria-labelledby": "live-heading" },
    el("h2", { id: "live-heading", text: "Sync state" }), gateways.map((g) => watchGateway(g.gateway_id)));
  return ["Gateways", live, view];
}

async function gatewayPage(gatewayId) {
  const gateway = await get(`/v1/gateways/${enc(gatewayId)}`);
  const deployments = await get(`/v1/gateways/${enc(gatewayId)}/deployments`);
  const parts = [
    el("section", { class: "card", "aria-labelledby": "state-heading" }, el("h2", { id: "state-heading", text: "Sync state" }), watchGateway(gatewayId)),
    el("section", { class: "card", "aria-labelledby": "deployments-heading" }, el("h2", { id: "deployments-heading", text: "Deployed APIs" }),
      deployments.length ? el("ul", { id: "deployments" }, deployments.map((d) => el("li", { text: d }))) : el("p", { text: "None." })),
  ];
  if (platform()) {
    parts.push(await collectionView(describe("/v1/gateways/{gateway_id}/policies"), { gateway_id: gatewayId }, { heading: "Gateway policies" }));
    const out = el("div", { id: "preview-output" });
    const validate = el("input", { type: "checkbox", id: "preview-validate" });
    const show = async () => {
      out.replaceChildren(el("p", { text: "Rendering…" }));
      try {
        const preview = await get(`/v1/gateways/${enc(gatewayId)}/preview${validate.checked ? "?validate=envoy" : ""}`);
        const summary = [`generation ${preview.generation}`, preview.snapshot_version ? `snapshot ${preview.snapshot_version}` : null,
          preview.refusal ? `refused: ${preview.refusal.reason} — ${preview.refusal.detail}` : null,
          preview.validation ? `Envoy: ${preview.validation.valid ? "valid" : `invalid — ${preview.validation.detail}`}` : null].filter(Boolean).join("; ");
        out.replaceChildren(el("p", { role: "status", text: summary }), el("pre", { tabindex: "0", "aria-label": "Rendered configuration", text: JSON.stringify(preview, null, 2) }));
      } catch (e) {
        if (e instanceof SignedOut) return failed(e);
        out.replaceChildren(errorBox(e));
      }
    };
    parts.push(el("section", { class: "card", "aria-labelledby": "preview-heading" },
      el("h2", { id: "preview-heading", text: "Rendered configuration (preview)" }),
      el("p", { text: "What this gateway's Link would publish for the desired state, by its own translator." }),
      el("div", { class: "actions" }, el("button", { type: "button", id: "show-preview", text: "Show the preview", onclick: show }),
        validate, el("label", { for: "preview-validate", text: "Validate with Envoy" })),
      out));
  }
  return [`Gateway ${gateway.gateway_id} — ${gateway.name}`, ...parts];
}

// Each navigation numbers itself: a slower earlier one never replaces the page of a later one, and its
// live views stop (watchGateway checks the number).
let seq = 0;

async function route() {
  const mine = ++seq;
  for (const stop of stops) stop();
  stops = [];
  if (!me()) return signedOut();
  await renderShell();
  const hash = location.hash || "#/";
  try {
    let m;
    let shown;
    if (hash === "#/" || hash === "#") {
      location.replace(me().tenant ? `#/t/${enc(me().tenant)}/apis` : "#/tenants");
      return;
    } else if (hash === "#/tenants") shown = await tenantsPage();
    else if ((m = hash.match(/^#\/t\/([^/]+)\/([a-z_-]+)$/))) shown = await tenantPage(decodeURIComponent(m[1]), m[2]);
    else if (hash === "#/gateways") shown = await gatewaysPage();
    else if ((m = hash.match(/^#\/gateways\/([^/]+)$/))) shown = await gatewayPage(decodeURIComponent(m[1]));
    else shown = ["Not found", el("p", { text: "No such page." })];
    if (mine === seq) page(...shown);
  } catch (e) {
    if (mine === seq) failed(e);
  }
}

async function start() {
  config = await loadConfig();
  spec = await openapi();
  if (location.pathname === "/console/callback") {
    try {
      await completeSignIn(config);
    } catch (e) {
      return signedOut(e.message);
    }
  }
  window.addEventListener("hashchange", route);
  await route();
}

start();
