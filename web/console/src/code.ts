// The code tab: runs code in the sandbox's code interpreter (template
// code-interpreter-v1) through the data plane's POST /code and shows its
// stream: output, rich results (images, tables, text) and errors.
import { dpFetch, readSSE } from "./api";
import { h, clear, errText } from "./dom";

const LANGUAGES = ["python", "javascript", "typescript", "r", "bash"];

export function codeTab(panel: HTMLElement, id: string, closers: (() => void)[]) {
  const lang = h("select", { id: "code-language" }, LANGUAGES.map((l) => h("option", { value: l }, l)));
  const src = h("textarea", { id: "code-input", class: "mono", rows: 8, spellcheck: "false", placeholder: "x = 1\nx + 1" });
  const run = h("button", { type: "submit", id: "code-run" }, "run");
  const stopBtn = h("button", { type: "button", class: "small", id: "code-stop", disabled: true }, "stop");
  const status = h("span", { class: "muted small", id: "code-status" });
  const out = h("div", { id: "code-output" });
  let abort: AbortController | null = null;
  stopBtn.addEventListener("click", () => abort?.abort());
  closers.push(() => abort?.abort());
  const form = h("form", null, src, h("div", { class: "bar" }, lang, run, stopBtn, status));
  const submit = async () => {
    abort?.abort();
    const ac = new AbortController();
    abort = ac;
    const cell = h("div", { class: "cell" }, h("pre", { class: "mono cell-src" }, src.value));
    out.prepend(cell);
    const log = h("pre", { class: "log" });
    run.disabled = true;
    stopBtn.disabled = false;
    status.textContent = "running…";
    const t0 = performance.now();
    try {
      const resp = await dpFetch(id, "POST", "/code", { code: src.value, language: lang.value }, { Accept: "text/event-stream" }, ac.signal);
      await readSSE(resp, (e) => {
        const ev = JSON.parse(e.data);
        if (e.event === "stdout" || e.event === "stderr") {
          if (!log.isConnected) cell.append(log);
          log.append(h("span", { class: e.event }, ev.text));
        } else if (e.event === "result") cell.append(resultView(ev));
        else if (e.event === "error") cell.append(h("pre", { class: "log code-error" }, h("span", { class: "stderr" }, `${ev.name}: ${ev.value}\n${ev.traceback || ""}`)));
        else if (e.event === "number_of_executions") cell.dataset.count = String(ev.execution_count);
      });
      status.textContent = `done in ${Math.round(performance.now() - t0)} ms`;
    } catch (e) {
      status.textContent = "";
      cell.append(h("p", { class: "err" }, ac.signal.aborted ? "stopped" : errText(e)));
    } finally {
      if (abort === ac) {
        run.disabled = false;
        stopBtn.disabled = true;
      }
    }
  };
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    submit();
  });
  // Ctrl-Enter runs, as in notebooks.
  src.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) {
      ev.preventDefault();
      submit();
    }
  });
  clear(panel, h("p", { class: "muted small" }, "Runs in the sandbox's code interpreter (template code-interpreter-v1); each language's context keeps its state between runs."), form, out);
}

// resultView shows a result in its richest safe form: images as data
// URLs, tables from the result's data or its HTML with only table markup
// kept (the interpreter runs in the sandbox: its HTML is untrusted), else
// text.
function resultView(r: any): HTMLElement {
  const box = h("div", { class: "result" + (r.is_main_result ? " main" : "") });
  if (r.png) box.append(h("img", { src: "data:image/png;base64," + r.png, alt: "png result" }));
  else if (r.jpeg) box.append(h("img", { src: "data:image/jpeg;base64," + r.jpeg, alt: "jpeg result" }));
  else if (r.svg) box.append(h("img", { src: "data:image/svg+xml;base64," + btoa(unescape(encodeURIComponent(r.svg))), alt: "svg result" }));
  else if (r.data && typeof r.data === "object" && !Array.isArray(r.data)) box.append(dataTable(r.data));
  else if (r.html) box.append(safeHTML(r.html));
  else box.append(h("pre", { class: "mono" }, r.text ?? r.markdown ?? r.latex ?? JSON.stringify(r.json ?? r.extra ?? {})));
  return box;
}

// dataTable renders {column: [values]} (a DataFrame's e2b/data).
function dataTable(data: Record<string, any[]>): HTMLElement {
  const cols = Object.keys(data);
  const n = Math.max(0, ...cols.map((c) => (Array.isArray(data[c]) ? data[c].length : 0)));
  const cell = (v: any) => (v === null || v === undefined ? "" : typeof v === "object" ? JSON.stringify(v) : String(v));
  return h("table", { class: "result-table" },
    h("thead", null, h("tr", null, cols.map((c) => h("th", null, c)))),
    h("tbody", null, Array.from({ length: Math.min(n, 1000) }, (_, i) => h("tr", null, cols.map((c) => h("td", null, cell((data[c] || [])[i])))))));
}

const KEEP = new Set(["TABLE", "THEAD", "TBODY", "TFOOT", "TR", "TH", "TD", "CAPTION", "B", "I", "EM", "STRONG", "CODE", "PRE", "P", "BR", "SPAN", "DIV", "UL", "OL", "LI", "H1", "H2", "H3", "H4"]);

// safeHTML keeps the text and the harmless structure of untrusted HTML:
// DOMParser builds an inert document (nothing in it runs or loads), from
// which allowed elements are copied without any attribute; everything
// else becomes its text (scripts and styles are dropped whole).
export function safeHTML(html: string): HTMLElement {
  // Attributes go before parsing too: the parser would compile event
  // handler attributes, which the page's CSP refuses (and reports).
  const bare = html.replace(/<(\/?)([A-Za-z][^\s/>]*)[^>]*>/g, "<$1$2>");
  const doc = new DOMParser().parseFromString(bare, "text/html");
  const copy = (n: Node, into: Node) => {
    for (const c of Array.from(n.childNodes)) {
      if (c.nodeType === Node.TEXT_NODE) into.appendChild(document.createTextNode(c.textContent || ""));
      else if (c.nodeType === Node.ELEMENT_NODE) {
        const tag = (c as Element).tagName;
        if (tag === "SCRIPT" || tag === "STYLE" || tag === "TEMPLATE") continue;
        if (KEEP.has(tag)) {
          const el = document.createElement(tag.toLowerCase());
          if (tag === "TABLE") el.className = "result-table";
          into.appendChild(el);
          copy(c, el);
        } else copy(c, into);
      }
    }
  };
  const box = h("div", { class: "result-html" });
  copy(doc.body, box);
  return box;
}
