import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import { ctl, ctlFetch, dp, dpFetch, follow, b64decode, APIError } from "./api";
import { h, clear, toast, errText, fmtBytes, fmtTime } from "./dom";
import { sandboxes, actions, listen, limitsText, templateOf } from "./main";
import { codeTab } from "./code";

const TABS = ["terminal", "files", "commands", "code", "network", "ports"];
const TERM_TAG = "console-terminal";

// SandboxView is one sandbox: its header (state, actions) and the tabs.
export class SandboxView {
  private closers: (() => void)[] = [];
  private panel: HTMLElement;
  private head: HTMLElement;
  private tabs: HTMLElement;

  constructor(root: HTMLElement, private id: string, private tab: string) {
    if (!TABS.includes(tab)) this.tab = "terminal";
    this.head = h("div", { class: "card sb-head", id: "sandbox-head" });
    this.tabs = h("nav", { class: "tabs" }, TABS.map((t) =>
      h("a", { href: `#/sandbox/${id}/${t}`, id: "tab-" + t, class: t === this.tab ? "sel" : "", hidden: t === "ports" }, t)));
    this.panel = h("div", { class: "card panel", id: "panel-" + this.tab });
    clear(root, this.head, this.tabs, this.panel);
    this.closers.push(listen(() => this.renderHead()));
    this.renderHead();
    const tabs: Record<string, () => void> = {
      terminal: () => this.terminal(), files: () => this.files(this.home()), commands: () => this.commands(),
      code: () => codeTab(this.panel, this.id, this.closers),
      network: () => this.network(), ports: () => this.ports(),
    };
    const open = (t: string) => {
      this.probePorts();
      tabs[t]();
    };
    // A sandbox being created has no data plane yet: open the tab once
    // it has started (or failed).
    const s = sandboxes.get(id);
    if (s && s.state === "creating") {
      clear(this.panel, h("p", { class: "muted" }, "Waiting for the sandbox to start…"));
      const off = listen(() => {
        const now = sandboxes.get(id);
        if (!now || now.state !== "creating") {
          off();
          open(this.tab);
        }
      });
      this.closers.push(off);
    } else open(this.tab);
  }

  // home is where the file browser opens: the template's working
  // directory (its default user may not write elsewhere), else /.
  private home(): string {
    const s = sandboxes.get(this.id);
    const t = s && templateOf(s.template);
    return (t && t.cwd) || "/";
  }

  close() {
    for (const f of this.closers) f();
    this.closers = [];
  }

  private renderHead() {
    const s = sandboxes.get(this.id);
    if (!s) {
      clear(this.head, h("h2", null, this.id), h("p", { class: "muted" }, "Not found (deleted, or not yet listed)."));
      return;
    }
    clear(this.head,
      h("h2", null, s.id, " ", h("span", { class: "state st-" + s.state, id: "sandbox-state" }, s.state)),
      h("p", { class: "muted small" }, `template ${s.template}`, s.driver ? ` · driver ${s.driver}` : "",
        limitsText(s.limits) ? ` · ${limitsText(s.limits)}` : "", s.network ? ` · network ${s.network.mode}` : "",
        s.expires_at ? ` · expires ${fmtTime(s.expires_at)}` : "", s.state_reason ? ` · ${s.state_reason}` : ""),
      actions(s));
  }

  // ---- terminal: a PTY command over the data plane ----

  private async terminal() {
    const box = h("div", { id: "terminal" });
    const status = h("span", { class: "muted small", id: "term-status" }, "starting…");
    const newBtn = h("button", { class: "small", id: "term-new" }, "new shell");
    clear(this.panel, h("div", { class: "bar" }, status, h("span", { class: "spacer" }), newBtn), box);
    const term = new Terminal({ cursorBlink: true, fontSize: 13, scrollback: 5000, fontFamily: "DejaVu Sans Mono, Menlo, monospace" });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    (window as any).spaceTerminal = term; // the browser test reads its buffer
    let cid = "";
    let stop: (() => void) | null = null;
    let exited = false;
    // stdin is sent in order, one request at a time, batching keystrokes.
    let pending = "";
    let sending = false;
    const enc = new TextEncoder();
    const flush = async () => {
      if (sending || !pending || !cid) return;
      sending = true;
      const data = pending;
      pending = "";
      try {
        await dpFetch(this.id, "POST", `/commands/${cid}/stdin`, enc.encode(data), { "Content-Type": "application/octet-stream" });
      } catch (e) {
        status.textContent = "stdin: " + errText(e);
      }
      sending = false;
      flush();
    };
    const d1 = term.onData((d) => {
      pending += d;
      flush();
    });
    let rt: any = null;
    const d2 = term.onResize(({ cols, rows }) => {
      clearTimeout(rt);
      rt = setTimeout(() => cid && !exited && dpFetch(this.id, "POST", `/commands/${cid}/resize`, { cols, rows }).catch(() => {}), 100);
    });
    const ro = new ResizeObserver(() => fit.fit());
    ro.observe(box);
    const attach = (id: string) => {
      stop?.();
      cid = id;
      exited = false;
      term.reset();
      status.textContent = `command ${cid}`;
      stop = follow({
        open: (last, signal) => dpFetch(this.id, "GET", `/commands/${cid}/events` + (last ? "?after=" + last : ""), undefined, { Accept: "text/event-stream" }, signal),
        onState: (on, err) => {
          status.textContent = on ? `command ${cid} · connected` : exited ? `command ${cid} · exited` : `command ${cid} · reconnecting${err ? " (" + errText(err) + ")" : ""}`;
        },
        onEvent: (e) => {
          if (e.event === "stdout" || e.event === "stderr") term.write(b64decode(e.data));
          else if (e.event === "exit") {
            exited = true;
            const x = JSON.parse(e.data);
            term.write(`\r\n\x1b[2m[exited ${x.signal || x.exit_code}]\x1b[0m\r\n`);
          }
        },
        done: (err) => exited || (err instanceof APIError && err.status < 500 && err.status !== 409),
      });
      term.focus();
    };
    const startShell = async () => {
      try {
        fit.fit();
        const c = await dp(this.id, "POST", "/commands", {
          shell: "command -v bash >/dev/null 2>&1 && exec bash -l || exec sh -l", tag: TERM_TAG,
          pty: { cols: term.cols, rows: term.rows }, env: { TERM: "xterm-256color" },
        });
        attach(c.id);
      } catch (e) {
        status.textContent = errText(e);
      }
    };
    newBtn.addEventListener("click", startShell);
    this.closers.push(() => {
      stop?.();
      d1.dispose();
      d2.dispose();
      ro.disconnect();
      term.dispose();
      if ((window as any).spaceTerminal === term) (window as any).spaceTerminal = null;
    });
    // Re-attach to this console's running shell (resuming its output from
    // the first event), else start one.
    try {
      const list = await dp(this.id, "GET", "/commands");
      const run = (list.commands || []).filter((c: any) => c.running && c.pty && c.tag === TERM_TAG);
      if (run.length) {
        attach(run[run.length - 1].id);
        const { cols, rows } = term;
        dpFetch(this.id, "POST", `/commands/${cid}/resize`, { cols, rows }).catch(() => {});
      } else await startShell();
    } catch (e) {
      status.textContent = errText(e);
    }
  }

  // ---- files: browse, upload, download, edit ----

  private async files(dir: string) {
    const pathIn = h("input", { id: "files-path", value: dir, class: "mono" });
    const upload = h("input", { id: "files-upload", type: "file", multiple: true });
    const list = h("table", { id: "files-table" });
    const editor = h("div", { id: "editor" });
    const go = (p: string) => this.files(p || "/");
    const join = (name: string) => (dir.endsWith("/") ? dir : dir + "/") + name;
    pathIn.addEventListener("keydown", (e) => e.key === "Enter" && go(pathIn.value.trim()));
    upload.addEventListener("change", async () => {
      for (const f of Array.from(upload.files || [])) {
        try {
          await dpFetch(this.id, "PUT", "/files?path=" + encodeURIComponent(join(f.name)), f, { "Content-Type": "application/octet-stream" });
          toast(`uploaded ${join(f.name)} (${fmtBytes(f.size)})`);
        } catch (e) {
          toast(errText(e), true);
        }
      }
      upload.value = "";
      go(dir);
    });
    const parent = dir === "/" ? "/" : dir.replace(/\/[^/]*\/?$/, "") || "/";
    clear(this.panel,
      h("div", { class: "bar" }, h("button", { class: "small", onclick: () => go(parent) }, "up"), pathIn,
        h("label", { class: "button small" }, "upload", upload),
        h("button", { class: "small", onclick: () => { const n = prompt("New file name"); if (n) this.edit(join(n), editor, "", () => go(dir)); } }, "new file"),
        h("button", { class: "small", onclick: async () => {
          const n = prompt("New directory name");
          if (!n) return;
          try {
            await dp(this.id, "POST", "/files/mkdir", { path: join(n) });
            go(dir);
          } catch (e) {
            toast(errText(e), true);
          }
        } }, "mkdir")),
      list, editor);
    try {
      const r = await dp(this.id, "GET", "/files/list?path=" + encodeURIComponent(dir));
      const entries = (r.entries || []).sort((a: any, b: any) => (a.type === "dir") !== (b.type === "dir") ? (a.type === "dir" ? -1 : 1) : a.name < b.name ? -1 : 1);
      clear(list, h("thead", null, h("tr", null, ["name", "size", "mode", "modified", ""].map((c) => h("th", null, c)))),
        h("tbody", null, entries.map((f: any) => h("tr", { "data-file": f.name },
          h("td", null, f.type === "dir" ? h("a", { href: "#", onclick: (e: Event) => { e.preventDefault(); go(f.path); } }, f.name + "/") : f.name,
            f.symlink_target ? h("span", { class: "muted" }, " → " + f.symlink_target) : null),
          h("td", null, f.type === "file" ? fmtBytes(f.size) : f.type), h("td", { class: "mono" }, (f.mode & 0o7777).toString(8)),
          h("td", { class: "small" }, fmtTime(new Date(f.mtime_unix * 1000).toISOString())),
          h("td", null, f.type === "file" ? [
            h("button", { class: "small", "data-action": "download", onclick: () => this.download(f.path, f.name) }, "download"),
            h("button", { class: "small", "data-action": "edit", disabled: f.size > 1 << 20, onclick: () => this.open(f.path, editor, () => go(dir)) }, "edit"),
          ] : null,
          h("button", { class: "small", "data-action": "delete", onclick: async () => {
            if (!confirm(`Remove ${f.path}?`)) return;
            try {
              await dpFetch(this.id, "DELETE", "/files?recursive=true&path=" + encodeURIComponent(f.path));
              go(dir);
            } catch (e) {
              toast(errText(e), true);
            }
          } }, "delete"))))));
    } catch (e) {
      clear(list, h("tr", null, h("td", { class: "err" }, errText(e))));
    }
  }

  private async download(path: string, name: string) {
    try {
      const blob = await (await dpFetch(this.id, "GET", "/files?path=" + encodeURIComponent(path))).blob();
      const url = URL.createObjectURL(blob);
      const a = h("a", { href: url, download: name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (e) {
      toast(errText(e), true);
    }
  }

  private async open(path: string, editor: HTMLElement, saved: () => void) {
    try {
      const buf = await (await dpFetch(this.id, "GET", "/files?path=" + encodeURIComponent(path))).arrayBuffer();
      let text: string;
      try {
        text = new TextDecoder("utf-8", { fatal: true }).decode(buf);
      } catch {
        toast(`${path} is not UTF-8 text; download it instead`, true);
        return;
      }
      this.edit(path, editor, text, saved);
    } catch (e) {
      toast(errText(e), true);
    }
  }

  private edit(path: string, editor: HTMLElement, text: string, saved: () => void) {
    const ta = h("textarea", { id: "editor-text", class: "mono", rows: 16, value: text, spellcheck: "false" });
    clear(editor, h("div", { class: "bar" }, h("strong", null, path), h("span", { class: "spacer" }),
      h("button", { id: "editor-save", onclick: async () => {
        try {
          await dpFetch(this.id, "PUT", "/files?path=" + encodeURIComponent(path), new TextEncoder().encode(ta.value), { "Content-Type": "application/octet-stream" });
          toast(`saved ${path}`);
          saved();
        } catch (e) {
          toast(errText(e), true);
        }
      } }, "save"), h("button", { onclick: () => clear(editor) }, "close")), ta);
    ta.focus();
  }

  // ---- commands: history and output (resumable) ----

  private async commands() {
    const list = h("table", { id: "commands-table" });
    const out = h("pre", { id: "command-output", class: "log" });
    const shell = h("input", { id: "command-shell", class: "mono", placeholder: "shell command, e.g. ls -la /" });
    let stop: (() => void) | null = null;
    let sel = "";
    const show = (c: any) => {
      stop?.();
      sel = c.id;
      out.textContent = "";
      const dec = new TextDecoder();
      let done = false;
      stop = follow({
        open: (last, signal) => dpFetch(this.id, "GET", `/commands/${c.id}/events` + (last ? "?after=" + last : ""), undefined, { Accept: "text/event-stream" }, signal),
        onEvent: (e) => {
          if (e.event === "stdout" || e.event === "stderr") out.append(h("span", { class: e.event }, dec.decode(b64decode(e.data), { stream: true })));
          else if (e.event === "dropped") out.append(h("span", { class: "muted" }, `[older output dropped: ${e.data}]\n`));
          else if (e.event === "exit") {
            done = true;
            out.append(h("span", { class: "muted" }, `\n[exit ${e.data}]\n`));
            refresh();
          }
        },
        done: (err) => done || err instanceof APIError,
      });
    };
    const refresh = async () => {
      try {
        const r = await dp(this.id, "GET", "/commands");
        const cmds = (r.commands || []).slice().reverse();
        clear(list, h("thead", null, h("tr", null, ["id", "command", "tag", "state", ""].map((c) => h("th", null, c)))),
          h("tbody", null, cmds.map((c: any) => h("tr", { "data-command": c.id, class: c.id === sel ? "sel" : "" },
            h("td", null, c.id), h("td", { class: "mono" }, c.argv.join(" ")), h("td", null, c.tag || ""),
            h("td", null, c.running ? "running" : `exit ${c.exit ? (c.exit.signal || c.exit.exit_code) : "?"}`, c.pty ? " (pty)" : ""),
            h("td", null, h("button", { class: "small", onclick: () => { show(c); refresh(); } }, "output"),
              c.running ? h("button", { class: "small", onclick: () => dp(this.id, "POST", `/commands/${c.id}/signal`, { signal: "SIGTERM" }).then(refresh, (e) => toast(errText(e), true)) }, "stop") : null)))));
      } catch (e) {
        clear(list, h("tr", null, h("td", { class: "err" }, errText(e))));
      }
    };
    const form = h("form", { class: "bar" }, shell, h("button", { type: "submit" }, "run"));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      try {
        const c = await dp(this.id, "POST", "/commands", { shell: shell.value, tag: "console" });
        show(c);
        refresh();
      } catch (e) {
        toast(errText(e), true);
      }
    });
    clear(this.panel, form, list, out);
    this.closers.push(() => stop?.());
    refresh();
  }

  // ---- network: the egress decision log, live ----

  private async network() {
    const rows = h("tbody");
    const counters = h("p", { class: "muted small", id: "network-counters" });
    const status = h("p", { class: "muted small" }, "connecting…");
    clear(this.panel, status, counters, h("table", { id: "network-table" },
      h("thead", null, h("tr", null, ["time", "proto", "name", "port", "verdict", "rule / reason", "dest"].map((c) => h("th", null, c)))), rows));
    try {
      const log = await ctl("GET", `/v1/sandboxes/${this.id}/network/log?limit=1`);
      counters.textContent = Object.entries(log.counters || {}).map(([k, v]) => `${k}=${v}`).join("  ");
    } catch (e) {
      status.textContent = e instanceof APIError && e.code === "egress_disabled" ? "This server runs without the egress gateway (space server --egress): sandboxes have no network and no decision log." : errText(e);
      return;
    }
    let ended = false;
    const stop = follow({
      open: (last, signal) => ctlFetch("GET", `/v1/sandboxes/${this.id}/network/log` + (last ? "?after=" + last : ""), undefined, { Accept: "text/event-stream" }, signal),
      onState: (on, err) => {
        status.textContent = on ? "live" : ended ? "ended: the sandbox is gone or has no network" : "reconnecting" + (err ? ": " + errText(err) : "");
      },
      onEvent: (e) => {
        if (e.event === "end") {
          ended = true;
          return;
        }
        if (e.event !== "decision") return;
        const d = JSON.parse(e.data);
        rows.prepend(h("tr", { class: d.verdict },
          h("td", { class: "small" }, fmtTime(d.time)), h("td", null, d.proto + (d.via ? " (" + d.via + ")" : "")), h("td", null, d.name || ""),
          h("td", null, d.port ? String(d.port) : ""), h("td", null, d.verdict), h("td", null, d.rule || d.reason || ""), h("td", { class: "mono small" }, d.dest || "")));
        while (rows.children.length > 500) rows.lastElementChild!.remove();
      },
      done: (err) => ended || err instanceof APIError,
    });
    this.closers.push(stop);
  }

  // ---- ports: forwarded ports as links (hidden where the server has none) ----

  private async probePorts() {
    try {
      await dp(this.id, "GET", "/ports");
      document.getElementById("tab-ports")?.removeAttribute("hidden");
    } catch {
      // 404 route_not_found: a server without port forwarding; other
      // errors (a paused sandbox): the tab stays hidden too.
    }
  }

  private async ports() {
    document.getElementById("tab-ports")?.removeAttribute("hidden");
    const body = h("div");
    clear(this.panel, body);
    let alive = true;
    let shown = ""; // the listing on screen (kept while it is unchanged, signed links too)
    const load = async () => {
      if (!alive) return;
      try {
        const r = await dp(this.id, "GET", "/ports");
        const ports = r.ports || [];
        const key = JSON.stringify(ports);
        if (key === shown) {
          setTimeout(load, 5000);
          return;
        }
        shown = key;
        clear(body, ports.length === 0 ? h("p", { class: "muted" }, "No listening ports.") : h("table", { id: "ports-table" },
          h("thead", null, h("tr", null, ["port", "address", "link", ""].map((c) => h("th", null, c)))),
          h("tbody", null, ports.map((p: any) => {
            const signed = h("span", { class: "small" });
            return h("tr", { "data-port": String(p.port) }, h("td", null, String(p.port)), h("td", { class: "mono" }, p.address || ""),
              h("td", null, p.url ? h("a", { href: p.url, target: "_blank", rel: "noopener noreferrer" }, p.url) : ""),
              h("td", null, h("button", { class: "small", onclick: async () => {
                try {
                  const u = await ctl("POST", `/v1/sandboxes/${this.id}/ports/${p.port}/url`);
                  clear(signed, h("a", { href: u.url || u.path_url, target: "_blank", rel: "noopener noreferrer", class: "signed" }, "signed link"), ` (expires ${fmtTime(u.expires_at)})`);
                } catch (e) {
                  toast(errText(e), true);
                }
              } }, "share link"), " ", signed));
          }))));
      } catch (e) {
        if (e instanceof APIError && e.code === "route_not_found") {
          document.getElementById("tab-ports")?.setAttribute("hidden", "");
          clear(body, h("p", { class: "muted" }, "This server does not forward ports."));
          return;
        }
        clear(body, h("p", { class: "err" }, errText(e)));
      }
      setTimeout(load, 5000);
    };
    load();
    this.closers.push(() => { alive = false; });
  }
}
