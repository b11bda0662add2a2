// Talks to the two public APIs exactly as the SDKs do: the control API on
// this page's own origin with the API key, the data plane (data_url of a
// session) with a per-sandbox session token. The key lives in
// sessionStorage only and travels in the Authorization header, never in a
// URL; no request carries cookies (credentials: "omit").

const KEY = "space.apiKey";

export function apiKey(): string | null {
  return sessionStorage.getItem(KEY);
}
export function setAPIKey(k: string) {
  sessionStorage.setItem(KEY, k);
}
export function clearAPIKey() {
  sessionStorage.removeItem(KEY);
  sessions.clear();
}

export class APIError extends Error {
  constructor(public status: number, public code: string, message: string) {
    super(message);
  }
}

let unauthorized: () => void = () => {};
export function onUnauthorized(f: () => void) {
  unauthorized = f;
}

async function errorOf(resp: Response): Promise<APIError> {
  let code = "http_" + resp.status;
  let msg = resp.statusText || "request failed";
  try {
    const j = await resp.json();
    if (j && j.error) {
      code = j.error.code;
      msg = j.error.message;
    }
  } catch {
    // not the JSON envelope
  }
  return new APIError(resp.status, code, msg);
}

function body(b: any, headers: Record<string, string>): BodyInit | undefined {
  if (b === undefined || b === null) return undefined;
  if (b instanceof FormData || b instanceof Blob || typeof b === "string" || b instanceof ArrayBuffer || b instanceof Uint8Array) return b as BodyInit;
  headers["Content-Type"] = "application/json";
  return JSON.stringify(b);
}

// ctlFetch calls the control API and returns the response (2xx only).
export async function ctlFetch(method: string, path: string, b?: any, extra?: Record<string, string>, signal?: AbortSignal): Promise<Response> {
  const headers: Record<string, string> = { Authorization: "Bearer " + (apiKey() || ""), ...(extra || {}) };
  const resp = await fetch(path, { method, headers, body: body(b, headers), cache: "no-store", credentials: "omit", signal });
  if (!resp.ok) {
    const e = await errorOf(resp);
    if (resp.status === 401) unauthorized();
    throw e;
  }
  return resp;
}

// ctl calls the control API and decodes its JSON answer.
export async function ctl(method: string, path: string, b?: any, extra?: Record<string, string>): Promise<any> {
  const resp = await ctlFetch(method, path, b, extra);
  if (resp.status === 204) return null;
  const ct = resp.headers.get("Content-Type") || "";
  return ct.includes("json") ? resp.json() : resp.text();
}

interface Session {
  token: string;
  data_url: string;
  expires: number;
}
const sessions = new Map<string, Session>();

// session returns a data-plane session for a sandbox, issuing a new one
// when there is none, it expires within a minute, or force is set.
export async function session(id: string, force = false): Promise<Session> {
  const s = sessions.get(id);
  if (s && !force && s.expires - Date.now() > 60_000) return s;
  const j = await ctl("POST", `/v1/sandboxes/${id}/session`);
  const n = { token: j.token, data_url: String(j.data_url).replace(/\/+$/, ""), expires: Date.parse(j.expires_at) };
  sessions.set(id, n);
  return n;
}

// dpFetch calls a sandbox's data plane; path is relative to
// /v1/sandboxes/{id}. An expired token is replaced once.
export async function dpFetch(id: string, method: string, path: string, b?: any, extra?: Record<string, string>, signal?: AbortSignal): Promise<Response> {
  for (let attempt = 0; ; attempt++) {
    const s = await session(id, attempt > 0);
    const headers: Record<string, string> = { Authorization: "Bearer " + s.token, ...(extra || {}) };
    const resp = await fetch(`${s.data_url}/v1/sandboxes/${id}${path}`, {
      method, headers, body: body(b, headers), cache: "no-store", credentials: "omit", mode: "cors", signal,
    });
    if (resp.ok) return resp;
    if (resp.status === 401 && attempt === 0) continue;
    throw await errorOf(resp);
  }
}

export async function dp(id: string, method: string, path: string, b?: any): Promise<any> {
  const resp = await dpFetch(id, method, path, b);
  if (resp.status === 204) return null;
  return resp.json();
}

export interface SSEEvent {
  id: string;
  event: string;
  data: string;
}

// readSSE parses a text/event-stream body (EventSource cannot send an
// Authorization header, so streams are fetched and parsed here).
export async function readSSE(resp: Response, onEvent: (e: SSEEvent) => void): Promise<void> {
  const reader = resp.body!.getReader();
  const dec = new TextDecoder();
  let buf = "";
  let id = "", event = "";
  let data: string[] = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let i: number;
    while ((i = buf.indexOf("\n")) >= 0) {
      let line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      if (line.endsWith("\r")) line = line.slice(0, -1);
      if (line === "") {
        if (data.length || event) onEvent({ id, event: event || "message", data: data.join("\n") });
        id = "";
        event = "";
        data = [];
        continue;
      }
      if (line[0] === ":") continue;
      const c = line.indexOf(":");
      const field = c < 0 ? line : line.slice(0, c);
      let v = c < 0 ? "" : line.slice(c + 1);
      if (v[0] === " ") v = v.slice(1);
      if (field === "data") data.push(v);
      else if (field === "event") event = v;
      else if (field === "id") id = v;
    }
  }
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface FollowOptions {
  // open starts the stream after the given event id ("" = from the start).
  open: (after: string, signal: AbortSignal) => Promise<Response>;
  onEvent: (e: SSEEvent) => void;
  // done says whether a stream that ended (or failed) is finished for good.
  done?: (err: any) => boolean;
  onState?: (live: boolean, err?: any) => void;
  after?: string;
}

// follow keeps a stream open, reconnecting after the last event id seen so
// nothing is lost or repeated. It returns a function that stops it.
export function follow(o: FollowOptions): () => void {
  const ac = new AbortController();
  let last = o.after || "";
  (async () => {
    let backoff = 250;
    while (!ac.signal.aborted) {
      let err: any = null;
      try {
        const resp = await o.open(last, ac.signal);
        o.onState?.(true);
        backoff = 250;
        await readSSE(resp, (e) => {
          if (e.id) last = e.id;
          o.onEvent(e);
        });
      } catch (e) {
        err = e;
      }
      if (ac.signal.aborted) return;
      o.onState?.(false, err);
      if (o.done?.(err)) return;
      await sleep(backoff);
      backoff = Math.min(backoff * 2, 5000);
    }
  })();
  return () => ac.abort();
}

export function b64decode(s: string): Uint8Array {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
