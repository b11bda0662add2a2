import { apiKey, setAPIKey, clearAPIKey, onUnauthorized, ctl, ctlFetch, follow, APIError } from "./api";
import { h, clear, toast, errText, fmtBytes, fmtTime } from "./dom";
import { SandboxView } from "./sandbox";

// ---- state shared by the views ----

export const sandboxes = new Map<string, any>();
const ops = new Map<string, any>();
let templates: any[] = [];
let stopEvents: (() => void) | null = null;
let current: { close(): void } | null = null;
const listeners = new Set<() => void>();

// upsert keeps the newer of two copies of a sandbox: answers and events
// arrive on different connections, in any order.
function upsert(s: any) {
  const old = sandboxes.get(s.id);
  if (!old || !(Date.parse(old.updated_at) >= Date.parse(s.updated_at))) sandboxes.set(s.id, s);
}

function changed() {
  renderSidebar();
  for (const f of listeners) f();
}

const app = document.getElementById("app")!;

// ---- login ----

function showLogin(msg?: string) {
  stopEvents?.();
  stopEvents = null;
  current?.close();
  current = null;
  const input = h("input", { id: "login-key", type: "password", autocomplete: "off", placeholder: "space_…", required: true });
  const err = h("p", { class: "err", id: "login-error" }, msg || "");
  const form = h("form", { id: "login", class: "card" },
    h("h1", null, "SPACE console"),
    h("p", null, "Log in with an API key (", h("code", null, "space keys create"), "). It is kept in this tab's session storage only and sent as an Authorization header."),
    input, h("button", { type: "submit", id: "login-submit" }, "Log in"), err);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    setAPIKey(input.value.trim());
    try {
      await ctl("GET", "/v1/info");
      start();
    } catch (e) {
      clearAPIKey();
      err.textContent = e instanceof APIError && e.status === 401 ? "That key was refused." : errText(e);
    }
  });
  clear(app, form);
  input.focus();
}

onUnauthorized(() => showLogin("The API key was refused; log in again."));

// ---- layout ----

let sidebar: HTMLElement, main: HTMLElement, opsBox: HTMLElement, live: HTMLElement;

function start() {
  live = h("span", { id: "live", class: "off", title: "lifecycle events stream" }, "offline");
  sidebar = h("aside", { id: "sidebar" });
  main = h("main", { id: "main" });
  opsBox = h("section", { id: "ops" });
  const header = h("header", null,
    h("a", { href: "#/", class: "brand" }, "SPACE"),
    h("nav", null, h("a", { href: "#/" }, "Sandboxes"), h("a", { href: "#/snapshots" }, "Snapshots"), h("a", { href: "#/templates" }, "Templates")),
    h("span", { class: "spacer" }), live,
    h("button", { id: "logout", onclick: () => { clearAPIKey(); showLogin(); } }, "Log out"));
  clear(app, header, h("div", { id: "layout" }, sidebar, main), opsBox);
  loadAll();
  startEvents();
  route();
}

window.addEventListener("hashchange", () => apiKey() && sidebar && route());

async function loadAll() {
  try {
    const [list, tl] = await Promise.all([ctl("GET", "/v1/sandboxes?limit=1000"), ctl("GET", "/v1/templates")]);
    for (const s of list.sandboxes) upsert(s);
    templates = tl.templates || [];
    changed();
  } catch (e) {
    toast(errText(e), true);
  }
}

// ---- live lifecycle events (GET /v1/events) ----

const fetching = new Set<string>();
// again: sandboxes whose events arrived while a fetch of them was in
// flight; that answer may predate the event, so they are fetched again.
const again = new Set<string>();

async function refetch(id: string) {
  if (fetching.has(id)) {
    again.add(id);
    return;
  }
  fetching.add(id);
  try {
    upsert(await ctl("GET", `/v1/sandboxes/${id}`));
  } catch (e) {
    if (e instanceof APIError && e.status === 404) sandboxes.delete(id);
  } finally {
    fetching.delete(id);
  }
  changed();
  if (again.delete(id)) refetch(id);
}

function startEvents() {
  stopEvents?.();
  const after = sessionStorage.getItem("space.eventsAfter") || "";
  let timer: any = null;
  stopEvents = follow({
    after,
    open: (last, signal) => ctlFetch("GET", "/v1/events" + (last ? "?after=" + encodeURIComponent(last) : ""), undefined, { Accept: "text/event-stream" }, signal),
    onState: (on) => {
      live.textContent = on ? "live" : "reconnecting";
      live.className = on ? "on" : "off";
    },
    onEvent: (e) => {
      if (e.id) sessionStorage.setItem("space.eventsAfter", e.id);
      let ev: any;
      try {
        ev = JSON.parse(e.data);
      } catch {
        return;
      }
      if (ev.type === "sandbox.state" && ev.data) {
        const s = sandboxes.get(ev.data.id);
        if (ev.data.state === "deleted") sandboxes.delete(ev.data.id);
        else if (s) {
          s.state = ev.data.state;
          s.state_reason = ev.data.reason || "";
          if (ev.created_at) s.updated_at = ev.created_at;
        } else refetch(ev.data.id);
      } else if (ev.type === "operation.updated" && ev.data) {
        trackOp(ev.data, false);
        const op = ev.data;
        if (op.state === "succeeded" && op.kind && op.kind.startsWith("sandbox.") && op.result && op.result.id && sandboxes.has(op.result.id)) {
          upsert(op.result);
        }
        if (op.kind === "template.build" && op.state === "succeeded") loadTemplates();
      }
      clearTimeout(timer);
      timer = setTimeout(changed, 30);
    },
  });
}

async function loadTemplates() {
  try {
    templates = (await ctl("GET", "/v1/templates")).templates || [];
    changed();
  } catch (e) {
    toast(errText(e), true);
  }
}

// ---- operations panel ----

const recentMs = 10 * 60 * 1000;

// trackOp records an operation; mine marks the ones started here, whose
// progress the panel shows until they are done.
export function trackOp(op: any, mine = true) {
  const old = ops.get(op.id);
  if (!old && !mine && Date.now() - Date.parse(op.updated_at) > recentMs) return;
  ops.set(op.id, { ...old, ...op, mine: mine || (old && old.mine) });
  renderOps();
}

function renderOps() {
  if (!opsBox) return;
  const list = [...ops.values()].sort((a, b) => (a.created_at < b.created_at ? 1 : -1)).slice(0, 8);
  clear(opsBox, list.length ? h("h3", null, "Operations") : null, list.map((op) =>
    h("div", { class: "op " + op.state, "data-op": op.id },
      h("span", { class: "kind" }, op.kind), h("span", { class: "target" }, op.target),
      h("progress", { max: 100, value: op.state === "succeeded" ? 100 : op.progress || 0 }),
      h("span", { class: "state" }, op.state),
      h("span", { class: "msg" }, op.error ? op.error.message : op.message || ""))));
}

// runOp starts a lifecycle call that answers an operation and follows it
// on /v1/operations/{id}/events until it is done.
export async function runOp(method: string, path: string, body?: any): Promise<any> {
  const res = await ctl(method, path, body);
  const list = res.sandboxes ? res.sandboxes.map((x: any) => x.operation) : [res.operation];
  for (const s of res.sandboxes || (res.sandbox ? [res] : [])) {
    if (s.sandbox) upsert(s.sandbox);
  }
  changed();
  for (const op of list) followOp(op);
  return res;
}

export function followOp(op: any, onDone?: (op: any) => void, onUpdate?: (op: any) => void) {
  trackOp(op);
  const stop = follow({
    open: (last, signal) => ctlFetch("GET", `/v1/operations/${op.id}/events` + (last ? "?after=" + last : ""), undefined, { Accept: "text/event-stream" }, signal),
    onEvent: (e) => {
      let o: any;
      try {
        o = JSON.parse(e.data);
      } catch {
        return;
      }
      if (o && o.type && o.data) o = o.data;
      trackOp(o);
      onUpdate?.(o);
      if (["succeeded", "failed", "cancelled"].includes(o.state)) {
        stop();
        if (o.state === "failed") toast(`${o.kind} ${o.target}: ${o.error ? o.error.message : "failed"}`, true);
        onDone?.(o);
      }
    },
    done: (err) => err instanceof APIError && err.status < 500,
  });
}

// ---- sidebar: every sandbox with its live state ----

function stateBadge(s: string) {
  return h("span", { class: "state st-" + s }, s);
}

function renderSidebar() {
  if (!sidebar) return;
  const list = [...sandboxes.values()].sort((a, b) => (a.created_at < b.created_at ? 1 : -1));
  clear(sidebar,
    h("div", { class: "side-head" }, h("h3", null, "Sandboxes"), h("a", { href: "#/", class: "small" }, "+ new")),
    list.length === 0 ? h("p", { class: "muted" }, "No sandboxes.") : null,
    h("ul", null, list.map((s) =>
      h("li", { "data-sandbox": s.id, class: location.hash.startsWith("#/sandbox/" + s.id) ? "sel" : "" },
        h("a", { href: `#/sandbox/${s.id}` }, h("span", { class: "id" }, s.id), stateBadge(s.state)),
        h("span", { class: "muted small" }, s.template)))));
}

// ---- router ----

function route() {
  current?.close();
  current = null;
  const parts = location.hash.replace(/^#\/?/, "").split("/");
  renderSidebar();
  if (parts[0] === "sandbox" && parts[1]) {
    current = new SandboxView(main, parts[1], parts[2] || "terminal");
  } else if (parts[0] === "templates") {
    current = templatesView();
  } else if (parts[0] === "snapshots") {
    current = snapshotsView();
  } else {
    current = sandboxesView();
  }
}

// templateOf is the listed template of that name (its cwd and user).
export function templateOf(name: string): any {
  return templates.find((t) => t.name === name);
}

export function listen(f: () => void): () => void {
  listeners.add(f);
  return () => listeners.delete(f);
}

// ---- sandboxes overview: create + table with lifecycle actions ----

export function actions(s: any): HTMLElement {
  const act = (label: string, f: () => Promise<any>, when: boolean) =>
    h("button", { class: "small", disabled: !when, "data-action": label, onclick: () => f().catch((e) => toast(errText(e), true)) }, label);
  const st = s.state;
  const snapshot = async () => {
    const r = await ctl("POST", `/v1/sandboxes/${s.id}/snapshots`);
    followOp(r.operation, (op) => op.state === "succeeded" && toast(`snapshot ${r.snapshot.id} ready`));
  };
  const del = async () => {
    if (confirm(`Delete ${s.id}?`)) await runOp("DELETE", `/v1/sandboxes/${s.id}`);
  };
  return h("span", { class: "actions" },
    act("pause", () => runOp("POST", `/v1/sandboxes/${s.id}/pause`), st === "running"),
    act("resume", () => runOp("POST", `/v1/sandboxes/${s.id}/resume`), st === "paused" || st === "hibernated"),
    act("hibernate", () => runOp("POST", `/v1/sandboxes/${s.id}/hibernate`), st === "running" || st === "paused"),
    act("snapshot", snapshot, st === "running" || st === "paused"),
    act("delete", del, st !== "deleting" && st !== "deleted"));
}

function num(v: string, mul = 1): number | undefined {
  const n = Number(v);
  return v.trim() === "" || !isFinite(n) || n <= 0 ? undefined : Math.round(n * mul);
}

function createForm(): HTMLElement {
  const tpl = h("select", { id: "create-template" }, templates.map((t) => h("option", { value: t.name }, t.name + (t.public ? "" : " (project)"))));
  const cpu = h("input", { id: "create-cpu", type: "number", min: 0, step: 0.1, placeholder: "default" });
  const mem = h("input", { id: "create-mem", type: "number", min: 0, placeholder: "default" });
  const pids = h("input", { id: "create-pids", type: "number", min: 0, placeholder: "default" });
  const timeout = h("input", { id: "create-timeout", type: "number", min: 0, placeholder: "server default" });
  const mode = h("select", { id: "create-network" }, ["blocked", "allowlist", "open"].map((m) => h("option", { value: m }, m)));
  const allow = h("textarea", { id: "create-allow", rows: 2, placeholder: "allowlist rules, one per line: api.example.com:443 GET /v1/*" });
  const form = h("form", { class: "card", id: "create" },
    h("h3", null, "Create a sandbox"),
    h("div", { class: "grid" },
      h("label", null, "Template", tpl),
      h("label", null, "CPU (cores)", cpu),
      h("label", null, "Memory (MiB)", mem),
      h("label", null, "Processes", pids),
      h("label", null, "Timeout (s)", timeout),
      h("label", null, "Network", mode)),
    h("label", { class: "wide" }, "Allowlist", allow),
    h("button", { type: "submit", id: "create-submit" }, "Create"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const req: any = { template: tpl.value };
    const limits: any = {};
    const c = num(cpu.value, 1000), m = num(mem.value, 1 << 20), p = num(pids.value);
    if (c) limits.cpu_millis = c;
    if (m) limits.memory_bytes = m;
    if (p) limits.pids = p;
    if (Object.keys(limits).length) req.limits = limits;
    if (timeout.value.trim() !== "") req.timeout_seconds = Number(timeout.value);
    if (mode.value !== "blocked") {
      req.network = { mode: mode.value };
      const rules = allow.value.split("\n").map((x) => x.trim()).filter(Boolean);
      if (mode.value === "allowlist") req.network.allow = rules;
    }
    try {
      const r = await runOp("POST", "/v1/sandboxes", req);
      location.hash = `#/sandbox/${r.sandbox.id}`;
    } catch (e) {
      toast(errText(e), true);
    }
  });
  return form;
}

function sandboxesView() {
  const box = h("div");
  const render = () => {
    const list = [...sandboxes.values()].sort((a, b) => (a.created_at < b.created_at ? 1 : -1));
    clear(box, createForm(),
      h("div", { class: "card" }, h("h3", null, "Sandboxes"),
        h("table", { id: "sandbox-table" },
          h("thead", null, h("tr", null, ["id", "template", "state", "limits", "created", "expires", ""].map((c) => h("th", null, c)))),
          h("tbody", null, list.map((s) => h("tr", { "data-sandbox": s.id },
            h("td", null, h("a", { href: `#/sandbox/${s.id}` }, s.id)),
            h("td", null, s.template), h("td", null, stateBadge(s.state), s.state_reason ? h("span", { class: "muted small" }, " " + s.state_reason) : null),
            h("td", { class: "small" }, limitsText(s.limits)),
            h("td", { class: "small" }, fmtTime(s.created_at)), h("td", { class: "small" }, fmtTime(s.expires_at)),
            h("td", null, actions(s))))))));
  };
  render();
  clear(main, box);
  return { close: listen(render) };
}

export function limitsText(l: any): string {
  if (!l) return "";
  const out: string[] = [];
  if (l.cpu_millis) out.push(l.cpu_millis / 1000 + " cpu");
  if (l.memory_bytes) out.push(fmtBytes(l.memory_bytes));
  if (l.pids) out.push(l.pids + " pids");
  if (l.disk_bytes) out.push(fmtBytes(l.disk_bytes) + " disk");
  return out.join(", ");
}

// ---- snapshots: list, fork, delete ----

function snapshotsView() {
  const box = h("div", { class: "card" });
  let alive = true;
  const load = async () => {
    try {
      const r = await ctl("GET", "/v1/snapshots?limit=1000");
      if (!alive) return;
      clear(box, h("h3", null, "Snapshots"), h("table", { id: "snapshot-table" },
        h("thead", null, h("tr", null, ["id", "sandbox", "kind", "state", "created", ""].map((c) => h("th", null, c)))),
        h("tbody", null, (r.snapshots || []).slice().reverse().map((s: any) => h("tr", null,
          h("td", null, s.id), h("td", null, s.sandbox_id), h("td", null, s.kind), h("td", null, s.state),
          h("td", { class: "small" }, fmtTime(s.created_at)),
          h("td", null,
            h("button", { class: "small", disabled: s.state !== "ready", onclick: () => runOp("POST", `/v1/snapshots/${s.id}/fork`, { count: 1 }).catch((e) => toast(errText(e), true)) }, "fork"),
            h("button", { class: "small", onclick: async () => {
              try {
                followOp((await ctl("DELETE", `/v1/snapshots/${s.id}`)).operation, load);
              } catch (e) {
                toast(errText(e), true);
              }
            } }, "delete")))))));
    } catch (e) {
      clear(box, h("p", { class: "err" }, errText(e)));
    }
  };
  load();
  clear(main, box);
  return { close: () => { alive = false; } };
}

// ---- templates: list, build from a build file with progress and logs ----

function templatesView() {
  const table = h("div", { class: "card" });
  const render = () => clear(table, h("h3", null, "Templates"), h("table", { id: "template-table" },
    h("thead", null, h("tr", null, ["name", "source", "size", "files", "owner", "created"].map((c) => h("th", null, c)))),
    h("tbody", null, templates.map((t) => h("tr", null, h("td", null, t.name), h("td", null, t.source), h("td", null, fmtBytes(t.size_bytes)),
      h("td", null, String(t.files)), h("td", null, t.public ? "public" : t.project || ""), h("td", { class: "small" }, fmtTime(t.created_at)))))));
  const name = h("input", { id: "build-name", placeholder: "name or name:tag", required: true });
  const file = h("textarea", { id: "build-file", rows: 8, class: "mono", value: "FROM minimal\nRUN echo built > /hello.txt\n" });
  const ctxFile = h("input", { id: "build-context", type: "file" });
  const progress = h("progress", { max: 100, value: 0 });
  const log = h("pre", { id: "build-log", class: "log" });
  const form = h("form", { class: "card", id: "build" }, h("h3", null, "Build from a build file"),
    h("label", null, "Name", name), h("label", { class: "wide" }, "Build file", file),
    h("label", null, "Context (tar, optional)", ctxFile), h("button", { type: "submit" }, "Build"), progress, log);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const fd = new FormData();
    fd.append("buildfile", new Blob([file.value], { type: "text/plain" }), "Buildfile");
    if (ctxFile.files && ctxFile.files[0]) fd.append("context", ctxFile.files[0], "context.tar");
    log.textContent = "";
    try {
      const r = await ctl("POST", "/v1/templates/build?name=" + encodeURIComponent(name.value.trim()), fd);
      let lastMsg = "";
      followOp(r.operation, async (op) => {
        log.textContent += `\n${op.state}${op.error ? ": " + op.error.message : ""}\n`;
        await showBuildLogs(op.id, log);
        loadTemplates();
      }, (op) => {
        progress.value = op.progress || 0;
        if (op.message && op.message !== lastMsg) {
          lastMsg = op.message;
          log.textContent += op.message + "\n";
        }
      });
    } catch (e) {
      toast(errText(e), true);
    }
  });
  render();
  clear(main, table, form);
  return { close: listen(render) };
}

async function showBuildLogs(opID: string, log: HTMLElement) {
  try {
    const list = await ctl("GET", `/v1/templates/builds/${opID}/logs`);
    for (const s of list.steps || []) {
      const text = await ctl("GET", `/v1/templates/builds/${opID}/logs?step=${s.step}`);
      log.textContent += `--- step ${s.step} (${fmtBytes(s.bytes)}) ---\n${text}\n`;
    }
  } catch (e) {
    log.textContent += "logs: " + errText(e) + "\n";
  }
}

// ---- boot ----

if (apiKey()) start();
else showLogin();
