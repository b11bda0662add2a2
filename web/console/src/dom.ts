// Elements are built with textContent only: names, output and file
// contents come from the sandbox and are never parsed as HTML.

type Child = Node | string | null | undefined | false;

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs?: Record<string, any> | null, ...children: (Child | Child[])[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "value") (el as any).value = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(typeof c === "string" ? document.createTextNode(c) : c);
  }
  return el;
}

export function clear(el: Element, ...children: (Child | Child[])[]) {
  el.replaceChildren();
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(typeof c === "string" ? document.createTextNode(c) : c);
  }
}

let toastBox: HTMLElement | null = null;

// toast shows a short message (errors in red).
export function toast(msg: string, err = false) {
  if (!toastBox) {
    toastBox = h("div", { id: "toasts" });
    document.body.append(toastBox);
  }
  if (err) console.error(msg);
  else console.info(msg);
  const t = h("div", { class: err ? "toast err" : "toast" }, msg);
  toastBox.append(t);
  setTimeout(() => t.remove(), err ? 8000 : 4000);
}

export function errText(e: any): string {
  if (e && e.code) return `${e.code}: ${e.message}`;
  return String(e && e.message ? e.message : e);
}

export function fmtBytes(n: number): string {
  if (n < 1024) return n + " B";
  const u = ["KiB", "MiB", "GiB", "TiB"];
  let i = -1;
  do {
    n /= 1024;
    i++;
  } while (n >= 1024 && i < u.length - 1);
  return n.toFixed(n < 10 ? 1 : 0) + " " + u[i];
}

export function fmtTime(s: string | undefined): string {
  if (!s) return "";
  const d = new Date(s);
  return isNaN(d.getTime()) ? s : d.toLocaleString();
}
