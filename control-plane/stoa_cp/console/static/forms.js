// Forms made from the CP's own request schemas (OpenAPI, JSON Schema): one field per property, named
// by its path in the body (`auth.scopes`), so a problem's `errors[].field` finds the field it names.

const WORDS = { api: "API", apis: "APIs", url: "URL", uri: "URI", jwks: "JWKS", ms: "(ms)", id: "id", ids: "ids" };

export function human(name) {
  const text = name
    .split(/[-_]/)
    .map((w) => WORDS[w] || w)
    .join(" ");
  return text.charAt(0).toUpperCase() + text.slice(1);
}

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function resolve(spec, schema) {
  let s = schema || {};
  while (s.$ref) s = spec.components.schemas[s.$ref.split("/").pop()];
  return s;
}

// A property's schema without the optional wrapper (anyOf [X, null]) and its kind of field.
export function shape(spec, raw) {
  let schema = resolve(spec, raw);
  let nullable = false;
  if (schema.anyOf) {
    const others = schema.anyOf.filter((s) => s.type !== "null");
    nullable = others.length < schema.anyOf.length;
    if (others.length === 1) schema = { ...resolve(spec, others[0]), default: schema.default, description: schema.description ?? resolve(spec, others[0]).description };
  }
  let kind = "text";
  if (schema.type === "object" || schema.properties) kind = schema.properties ? "group" : "json";
  else if (schema.type === "array") kind = "list";
  else if (schema.type === "boolean") kind = "checkbox";
  else if (schema.type === "integer" || schema.type === "number") kind = "number";
  else if (schema.enum || schema.const !== undefined) kind = "select";
  else if (schema.anyOf) kind = "json";
  return { schema, nullable, kind };
}

function fieldId(form, path) {
  return `${form}-${path.replace(/[^A-Za-z0-9_]+/g, "-")}`;
}

function build(spec, formId, path, name, raw, required, value) {
  const { schema, kind } = shape(spec, raw);
  if (kind === "group") {
    const set = el("fieldset", { "data-field": path }, el("legend", { text: human(name) }));
    for (const [key, sub] of Object.entries(schema.properties)) {
      set.append(build(spec, formId, `${path}.${key}`, key, sub, (schema.required || []).includes(key), value?.[key]));
    }
    set.append(el("p", { class: "field-error", id: `${fieldId(formId, path)}-error`, hidden: true }));
    return set;
  }
  const id = fieldId(formId, path);
  const hints = [];
  if (kind === "list") hints.push("several values: separate them with commas");
  if (kind === "json") hints.push("a JSON object");
  if (schema.description && !/^Shown once/.test(schema.description)) hints.push(schema.description);
  const hintId = hints.length ? `${id}-hint` : null;
  const describedBy = [hintId, `${id}-error`].filter(Boolean).join(" ");
  const current = value !== undefined ? value : schema.default;
  let input;
  const common = { id, name: path, "data-kind": kind, "aria-describedby": describedBy, required: required && kind !== "checkbox" && kind !== "list" };
  if (kind === "checkbox") {
    input = el("input", { ...common, type: "checkbox", checked: Boolean(current) });
  } else if (kind === "select") {
    const options = schema.enum || [schema.const];
    input = el("select", common, required ? null : el("option", { value: "", text: "—" }),
      options.map((o) => el("option", { value: o, text: o, selected: o === current })));
  } else if (kind === "json") {
    input = el("textarea", { ...common, rows: 6, spellcheck: "false" });
    input.value = current === undefined || current === null ? "" : JSON.stringify(current, null, 2);
  } else if (kind === "number") {
    input = el("input", { ...common, type: "number", min: schema.minimum, max: schema.maximum });
    if (current !== undefined && current !== null) input.value = current;
  } else {
    input = el("input", { ...common, type: "text", autocomplete: "off", spellcheck: "false" });
    if (kind === "list" && Array.isArray(current)) input.value = current.join(", ");
    else if (current !== undefined && current !== null) input.value = current;
  }
  const label = el("label", { for: id, text: human(name) + (required ? " (required)" : "") });
  return el(
    "div",
    { class: `field${kind === "checkbox" ? " checkbox" : ""}`, "data-field": path },
    kind === "checkbox" ? [input, " ", label] : [label, input],
    hintId ? el("p", { class: "hint", id: hintId, text: hints.join("; ") }) : null,
    el("p", { class: "field-error", id: `${id}-error`, hidden: true }),
  );
}

// A form for `schema` (an object schema); `value` fills it (editing); `skip` leaves fields out.
export function schemaForm(spec, formId, schemaRef, { value = {}, skip = [], first = [], submitLabel, onSubmit }) {
  const schema = resolve(spec, schemaRef);
  const form = el("form", { class: "resource", id: formId, novalidate: true });
  form.append(el("div", { class: "form-errors", tabindex: "-1", hidden: true }));
  // The resource's own id first, whatever order the schema lists it in.
  const keys = Object.keys(schema.properties || {});
  const ordered = [...first.filter((k) => keys.includes(k)), ...keys.filter((k) => !first.includes(k))];
  for (const key of ordered) {
    const sub = schema.properties[key];
    if (skip.includes(key)) continue;
    form.append(build(spec, formId, key, key, sub, (schema.required || []).includes(key), value[key]));
  }
  form.append(el("div", { class: "actions" }, el("button", { type: "submit", text: submitLabel })));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const { body, errors } = collect(spec, form, schema, "");
    if (errors.length) {
      showProblem(form, { title: "Check the fields", errors });
      return;
    }
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      await onSubmit(body, form);
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

function collect(spec, form, schema, prefix) {
  const body = {};
  const errors = [];
  for (const [key, raw] of Object.entries(schema.properties || {})) {
    const path = prefix ? `${prefix}.${key}` : key;
    const { schema: sub, kind } = shape(spec, raw);
    if (kind === "group") {
      if (!form.querySelector(`[data-field="${path}"]`)) continue;
      const inner = collect(spec, form, sub, path);
      errors.push(...inner.errors);
      body[key] = inner.body;
      continue;
    }
    const input = form.elements.namedItem(path);
    if (!input) continue;
    if (kind === "checkbox") {
      body[key] = input.checked;
      continue;
    }
    const text = input.value.trim();
    if (text === "") continue; // the CP's default applies (or it names the missing field)
    if (kind === "list") body[key] = text.split(",").map((v) => v.trim()).filter(Boolean);
    else if (kind === "number") body[key] = Number(text);
    else if (kind === "json") {
      try {
        body[key] = JSON.parse(text);
      } catch (e) {
        errors.push({ field: path, message: `is not valid JSON (${e.message})` });
      }
    } else body[key] = text;
  }
  return { body, errors };
}

export function clearErrors(form) {
  for (const p of form.querySelectorAll(".field-error")) {
    p.hidden = true;
    p.textContent = "";
  }
  for (const i of form.querySelectorAll("[aria-invalid]")) i.removeAttribute("aria-invalid");
  const summary = form.querySelector(".form-errors");
  summary.hidden = true;
  summary.replaceChildren();
}

// The field a problem names, or the closest enclosing one: `config.allowedOrigins[1]` → `config`.
function fieldFor(form, name) {
  let path = name;
  while (path) {
    const found = form.querySelector(`[data-field="${CSS.escape(path)}"]`);
    if (found) return found;
    const cut = Math.max(path.lastIndexOf("."), path.lastIndexOf("["));
    if (cut <= 0) break;
    path = path.slice(0, cut);
  }
  return null;
}

// Each message next to its field (the input marked invalid and described by it), and all of them
// in a summary at the top of the form that takes the focus.
export function showProblem(form, problem) {
  const summary = form.querySelector(".form-errors");
  const items = [];
  for (const { field, message } of problem.errors || []) {
    const wrapper = fieldFor(form, field);
    const text = `${field}: ${message}`;
    if (wrapper) {
      const error = wrapper.querySelector(":scope > .field-error");
      // Next to its own field the message says enough; about a part of it, it names the part.
      const here = wrapper.dataset.field === field ? message : text;
      error.hidden = false;
      error.textContent = error.textContent ? `${error.textContent} ${here}` : here;
      const input = wrapper.querySelector(":scope > input, :scope > select, :scope > textarea");
      if (input) input.setAttribute("aria-invalid", "true");
      const target = input || wrapper;
      items.push(el("li", {}, el("a", { href: `#${target.id || ""}`, "data-focus": target.id, text })));
    } else {
      items.push(el("li", { text }));
    }
  }
  summary.replaceChildren(
    el("p", { text: `${problem.title || "Refused"}${problem.status ? ` (${problem.status})` : ""}` }),
    items.length ? el("ul", {}, items) : el("p", { text: problem.message || "" }),
  );
  summary.className = "form-errors alert";
  summary.setAttribute("role", "alert");
  summary.hidden = false;
  for (const a of summary.querySelectorAll("a[data-focus]")) {
    a.addEventListener("click", (e) => {
      e.preventDefault();
      document.getElementById(a.dataset.focus)?.focus();
    });
  }
  summary.focus();
}
