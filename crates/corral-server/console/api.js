// The API as the console uses it: the key (if any) from this tab's sessionStorage, sent as a
// header; errors as ApiError with the server's code and message; NDJSON streams read event by
// event. Nothing here touches the page.

const KEY = "corral.key";

export function key() {
  return sessionStorage.getItem(KEY);
}

export function setKey(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function headers(extra) {
  const h = new Headers(extra || {});
  const k = key();
  if (k) h.set("Authorization", "Bearer " + k);
  return h;
}

async function failure(response) {
  let code = "http_" + response.status;
  let message = response.status + " " + response.statusText;
  try {
    const body = await response.json();
    if (body && body.error) {
      code = String(body.error.code);
      message = String(body.error.message);
    }
  } catch (_) {
    // Not the API's error format: the status says it.
  }
  return new ApiError(response.status, code, message);
}

// A request; `json` is sent as the JSON body, `body` as is. Answers the response.
export async function request(method, path, { json, body, signal, accept } = {}) {
  const extra = {};
  if (json !== undefined) extra["Content-Type"] = "application/json";
  if (accept) extra["Accept"] = accept;
  const response = await fetch(path, {
    method,
    headers: headers(extra),
    body: json !== undefined ? JSON.stringify(json) : body,
    signal,
    credentials: "omit",
    cache: "no-store",
    redirect: "error",
  });
  if (!response.ok) throw await failure(response);
  return response;
}

export async function getJson(path) {
  return (await request("GET", path, { accept: "application/json" })).json();
}

export async function sendJson(method, path, json) {
  const response = await request(method, path, { json, accept: "application/json" });
  return response.status === 204 ? null : response.json();
}

// Posts `json` and calls `onEvent` with each NDJSON event of the answer, in order. Aborting
// `signal` closes the stream, which interrupts the execution on the server.
export async function stream(path, json, onEvent, signal) {
  const response = await request("POST", path, { json, signal, accept: "application/x-ndjson" });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += value;
    let newline;
    while ((newline = pending.indexOf("\n")) >= 0) {
      const line = pending.slice(0, newline);
      pending = pending.slice(newline + 1);
      if (line.trim()) onEvent(JSON.parse(line));
    }
  }
  if (pending.trim()) onEvent(JSON.parse(pending));
}

// A workspace path as a URL path: each segment encoded, the slashes kept.
export function filePath(sandbox, path) {
  const segments = path.split("/").filter((s) => s !== "").map(encodeURIComponent);
  return "/v1/sandboxes/" + encodeURIComponent(sandbox) + "/files/" + segments.join("/");
}
