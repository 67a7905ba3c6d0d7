// Building the page from untrusted data. Every string a sandbox or a client made (output,
// file names, results, errors) goes in as text (textContent, attribute values), never as
// markup; HTML results go into an <iframe sandbox> with no permission at all (no scripts,
// not the console's origin), which also inherits the console's Content-Security-Policy.

// An element: `attrs` set as properties or attributes (never `innerHTML`), children appended
// (strings as text nodes).
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Terminal colour and cursor sequences (IPython colours its tracebacks) removed.
export function plain(text) {
  return String(text).replace(/\x1b\[[0-9;?]*[ -\/]*[@-~]/g, "");
}

export function bytes(n) {
  if (n === undefined || n === null) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = Number(n);
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return (i === 0 ? v : v.toFixed(1)) + " " + units[i];
}

export function age(iso) {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (!isFinite(seconds)) return "";
  if (seconds < 60) return Math.floor(seconds) + " s";
  if (seconds < 3600) return Math.floor(seconds / 60) + " min";
  if (seconds < 86400) return (seconds / 3600).toFixed(1) + " h";
  return (seconds / 86400).toFixed(1) + " d";
}

function base64Utf8(text) {
  const data = new TextEncoder().encode(text);
  let binary = "";
  for (let i = 0; i < data.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, data.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

// One rich result (docs/results.md#rich-results) as elements: images as images (an SVG as an
// <img>, where it can run no script), HTML in a sandboxed frame, everything else as text.
export function result(r) {
  const parts = [];
  if (typeof r.png === "string" && BASE64.test(r.png)) {
    parts.push(el("img", { src: "data:image/png;base64," + r.png, alt: r.text || "image result", class: "result-png" }));
  }
  if (typeof r.svg === "string") {
    parts.push(el("img", { src: "data:image/svg+xml;base64," + base64Utf8(r.svg), alt: "SVG result", class: "result-svg" }));
  }
  if (typeof r.html === "string") {
    const frame = document.createElement("iframe");
    // Set before the content: no permission (no scripts, no same origin, no forms, no
    // popups, no top navigation).
    frame.setAttribute("sandbox", "");
    frame.setAttribute("referrerpolicy", "no-referrer");
    frame.className = "result-html";
    frame.title = "HTML result";
    frame.srcdoc = r.html;
    parts.push(frame);
  }
  if (parts.length === 0) {
    let text = r.text;
    if (typeof r.markdown === "string") text = r.markdown;
    else if (r.json !== undefined) text = JSON.stringify(r.json, null, 2);
    if (text !== undefined) parts.push(el("pre", { class: "result-text", text: plain(text) }));
  }
  return parts;
}

// A language error (`error` event): its name and value, and the traceback as text.
export function error(e) {
  const head = plain((e.name || "Error") + (e.value ? ": " + e.value : ""));
  const trace = e.traceback ? plain(e.traceback) : "";
  const text = trace && trace.includes(head) ? trace : [trace, head].filter(Boolean).join("\n");
  return el("pre", { class: "traceback", text });
}

export function clear(node) {
  node.replaceChildren();
}
