// The console: routing between views, the sandboxes list, the playground (cells, files,
// terminal) and operations (health, sessions per key, audit log, egress decisions, keys).
import { ApiError, filePath, getJson, key, request, sendJson, setKey, stream } from "./api.js";
import { age, bytes, clear, el, error, plain, result } from "./render.js";

const $ = (id) => document.getElementById(id);
const REFRESH_MS = 3000;
let me = null; // {key_id, name, operator}
let timer = null;

function banner(message) {
  $("banner").textContent = message || "";
  $("banner").classList.toggle("hidden", !message);
}

function fail(e) {
  if (e instanceof ApiError && e.status === 401) {
    showLogin(e.message);
    return;
  }
  banner(e instanceof Error ? e.message : String(e));
}

// --- who, and the key -------------------------------------------------------------------

function showLogin(message) {
  me = null;
  document.querySelectorAll(".view").forEach((v) => v.classList.add("hidden"));
  $("login").classList.remove("hidden");
  $("login-error").textContent = message || "";
  $("who").textContent = "";
}

async function identify() {
  try {
    me = await getJson("/v1/whoami");
  } catch (e) {
    if (e instanceof ApiError && (e.status === 401 || e.status === 403)) {
      showLogin(key() ? e.message : "");
      return false;
    }
    throw e;
  }
  $("login").classList.add("hidden");
  document.body.classList.toggle("operator", !!me.operator);
  $("who").textContent = (me.name || me.key_id) + (me.operator ? " (operator)" : "");
  $("forget-key").classList.toggle("hidden", !key());
  $("use-key").classList.toggle("hidden", !!key());
  $("owner-filter-label").classList.toggle("hidden", !me.operator);
  if (me.operator) await keyOptions();
  return true;
}

// The operator's filter of the sandboxes list: mine, every key's, or one key's.
async function keyOptions() {
  const select = $("owner-filter");
  const { keys } = await getJson("/v1/keys");
  const options = [el("option", { value: "" }, "mine"), el("option", { value: "*" }, "every key"),
    el("option", { value: "local" }, "local (no key)")];
  for (const k of keys) if (!k.revoked) options.push(el("option", { value: k.id }, k.id + " (" + k.name + ")"));
  const chosen = select.value;
  select.replaceChildren(...options);
  select.value = chosen;
}

$("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  setKey($("login-key").value.trim());
  $("login-key").value = "";
  if (await identify().catch(fail)) route();
});

$("use-key").addEventListener("click", () => {
  clearInterval(timer);
  showLogin("");
  $("login-key").focus();
});

$("forget-key").addEventListener("click", () => {
  setKey(null);
  showLogin("");
});

// --- routing ------------------------------------------------------------------------------

function show(view) {
  document.querySelectorAll(".view").forEach((v) => v.classList.toggle("hidden", v.id !== view));
  $("nav-sandboxes").classList.toggle("active", view !== "view-ops");
  $("nav-ops").classList.toggle("active", view === "view-ops");
}

function every(ms, fn) {
  clearInterval(timer);
  fn();
  timer = setInterval(fn, ms);
}

async function route() {
  if (!me) return;
  banner("");
  const hash = location.hash;
  if (hash.startsWith("#/sandbox/")) {
    show("view-playground");
    openPlayground(decodeURIComponent(hash.slice("#/sandbox/".length)));
  } else if (hash === "#/ops") {
    show("view-ops");
    every(REFRESH_MS * 2, refreshOps);
    loadAudit(false);
    loadEgress(false);
    if (me.operator) loadKeys();
  } else {
    show("view-sandboxes");
    every(REFRESH_MS, refreshSandboxes);
  }
}

window.addEventListener("hashchange", route);

// --- sandboxes ----------------------------------------------------------------------------

async function listSandboxes() {
  const owner = me.operator ? $("owner-filter").value : "";
  if (owner === "") {
    const page = await getJson("/v1/sandboxes");
    return page.sandboxes.map((s) => ({ ...s, key_id: me.key_id }));
  }
  const query = owner === "*" ? "" : "?key=" + encodeURIComponent(owner);
  return operatorSandboxes(query);
}

// Every key's sandboxes (an operator's list), page after page (at most 100 pages of 1000).
async function operatorSandboxes(query) {
  let rows = [];
  let after = null;
  for (let i = 0; i < 100; i++) {
    const cursor = after === null ? "" : (query ? "&" : "?") + "after=" + encodeURIComponent(after);
    const page = await getJson("/v1/operator/sandboxes" + query + cursor);
    rows = rows.concat(page.sandboxes);
    if (!page.next) break;
    after = page.next;
  }
  return rows;
}

async function latestMetric(id) {
  try {
    const { metrics } = await getJson("/v1/sandboxes/" + encodeURIComponent(id) + "/metrics");
    return metrics[metrics.length - 1] || null;
  } catch (_) {
    return null;
  }
}

function egress(network) {
  if (!network) return "—";
  return "↑" + bytes(network.bytes_up) + " ↓" + bytes(network.bytes_down) +
    " (" + network.connections + " conn., " + network.denied + " denied)";
}

async function refreshSandboxes() {
  if (!me) return;
  let sandboxes;
  try {
    sandboxes = await listSandboxes();
  } catch (e) {
    return fail(e);
  }
  const mine = (s) => s.key_id === me.key_id;
  // The operator's listing carries each sandbox's latest reading; a key's own is asked for.
  const metrics = await Promise.all(sandboxes.map((s) =>
    s.usage !== undefined ? s.usage : (s.state !== "dead" ? latestMetric(s.id) : null)));
  // Rows are kept from one refresh to the next (a button is not replaced under the pointer):
  // a row is rebuilt only when its state or key changed, else its readings are updated.
  const body = $("sandboxes").tBodies[0];
  const rows = new Map([...body.rows].map((r) => [r.dataset.id, r]));
  sandboxes.forEach((s, i) => {
    const m = metrics[i];
    const readings = [
      age(s.created_at),
      m ? bytes(m.memory_used_bytes) + " / " + bytes(m.memory_limit_bytes) : "—",
      m ? m.cpu_used_pct.toFixed(1) + " %" : "—",
      egress(s.network),
    ];
    let row = rows.get(s.id);
    rows.delete(s.id);
    if (row && row.dataset.state === s.state && row.dataset.key === s.key_id) {
      row.querySelectorAll("td.reading").forEach((cell, j) => {
        if (cell.textContent !== readings[j]) cell.textContent = readings[j];
      });
    } else {
      const fresh = sandboxRow(s, readings, mine(s));
      if (row) row.replaceWith(fresh);
      row = fresh;
    }
    if (body.rows[i] !== row) body.insertBefore(row, body.rows[i] || null);
  });
  rows.forEach((gone) => gone.remove());
  $("sandboxes-empty").classList.toggle("hidden", sandboxes.length > 0);
}

function sandboxRow(s, readings, mine) {
  const actions = [];
  if (mine) {
    actions.push(el("a", { href: "#/sandbox/" + encodeURIComponent(s.id), class: "open" }, "Open"));
    if (s.state === "running") actions.push(el("button", { type: "button", class: "pause", onclick: () => act("pause", s.id) }, "Pause"));
    if (s.state === "paused") actions.push(el("button", { type: "button", class: "resume", onclick: () => act("resume", s.id) }, "Resume"));
    actions.push(el("button", { type: "button", class: "danger kill", onclick: () => kill(s.id) }, "Kill"));
  }
  return el("tr", { "data-id": s.id, "data-state": s.state, "data-key": s.key_id },
    el("td", { class: "mono" }, s.id),
    el("td", { class: "mono op-only" }, s.key_id),
    el("td", {}, s.image),
    el("td", {}, s.language),
    el("td", {}, el("span", { class: "pill " + s.state }, s.state)),
    readings.map((text) => el("td", { class: "reading" }, text)),
    el("td", { class: "row" }, actions),
  );
}

async function act(what, id) {
  try {
    await sendJson("POST", "/v1/sandboxes/" + encodeURIComponent(id) + "/" + what);
  } catch (e) {
    fail(e);
  }
  refreshSandboxes();
}

async function kill(id) {
  try {
    await request("DELETE", "/v1/sandboxes/" + encodeURIComponent(id));
  } catch (e) {
    fail(e);
  }
  if (location.hash.startsWith("#/sandbox/")) location.hash = "#/";
  else refreshSandboxes();
}

$("create-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("create").disabled = true;
  try {
    const s = await sendJson("POST", "/v1/sandboxes", {
      image: $("create-image").value.trim(),
      language: $("create-language").value,
    });
    location.hash = "#/sandbox/" + encodeURIComponent(s.id);
  } catch (e) {
    fail(e);
  } finally {
    $("create").disabled = false;
  }
});

$("owner-filter").addEventListener("change", refreshSandboxes);

// --- the playground -------------------------------------------------------------------------

let current = null; // the sandbox open in the playground

function base() {
  return "/v1/sandboxes/" + encodeURIComponent(current.id);
}

async function openPlayground(id) {
  clearInterval(timer);
  let info;
  try {
    info = await getJson("/v1/sandboxes/" + encodeURIComponent(id));
  } catch (e) {
    fail(e);
    return;
  }
  if (!current || current.id !== id) {
    current = info;
    clear($("cells"));
    clear($("term-out"));
    addCell(info.language === "python" ? "import pandas as pd\nprint('hello from', pd.__name__)" : "");
  }
  current = info;
  $("pg-id").textContent = info.id + " · " + info.image + " · " + info.language;
  showState(info.state);
  refreshFiles();
  every(REFRESH_MS * 2, async () => {
    try {
      const now = await getJson(base());
      showState(now.state);
    } catch (_) {
      showState("dead");
    }
  });
}

function showState(state) {
  $("pg-state").textContent = state;
  $("pg-state").className = "pill " + state;
}

function addCell(code) {
  const area = el("textarea", { spellcheck: "false", class: "code", "aria-label": "code" });
  area.value = code || "";
  const output = el("div", { class: "output" });
  const status = el("span", { class: "status" });
  const run = el("button", { type: "button", class: "run" }, "Run");
  const stop = el("button", { type: "button", class: "interrupt", disabled: true }, "Interrupt");
  const cell = el("div", { class: "cell" }, area, el("div", { class: "bar" }, run, stop, status), output);
  let controller = null;
  const execute = async () => {
    if (controller) return;
    controller = new AbortController();
    run.disabled = true;
    stop.disabled = false;
    clear(output);
    status.textContent = "running…";
    let last = null; // the <pre> that stdout or stderr is being appended to
    const text = (kind, chunk) => {
      if (!last || last.dataset.kind !== kind) {
        last = el("pre", { class: kind, "data-kind": kind });
        output.append(last);
      }
      last.textContent += plain(chunk);
    };
    try {
      await stream(base() + "/execute", { code: area.value }, (event) => {
        switch (event.type) {
          case "stdout":
          case "stderr":
            text(event.type, event.text);
            break;
          case "result":
            last = null;
            output.append(...result(event));
            break;
          case "error":
            last = null;
            output.append(error(event));
            break;
          case "end":
            status.textContent = event.status + " · " + event.execution_time_ms + " ms" +
              (event.error_message ? " · " + event.error_message : "");
            break;
        }
      }, controller.signal);
    } catch (e) {
      if (e.name === "AbortError") status.textContent = "interrupted";
      else {
        status.textContent = "";
        output.append(el("pre", { class: "traceback", text: e.message }));
      }
    } finally {
      controller = null;
      run.disabled = false;
      stop.disabled = true;
      cell.dataset.done = String((Number(cell.dataset.done) || 0) + 1);
    }
  };
  run.addEventListener("click", execute);
  // Closing the stream interrupts the execution (docs/api.md): the session keeps its state.
  stop.addEventListener("click", () => controller && controller.abort());
  area.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.shiftKey || ev.ctrlKey)) {
      ev.preventDefault();
      execute();
    }
  });
  $("cells").append(cell);
  return cell;
}

$("add-cell").addEventListener("click", () => addCell("").querySelector("textarea").focus());

$("pg-restart").addEventListener("click", async () => {
  try {
    const info = await sendJson("POST", base() + "/restart");
    showState(info.state);
    banner("");
  } catch (e) {
    fail(e);
  }
});

$("pg-kill").addEventListener("click", () => kill(current.id));

// Files of /workspace.
async function refreshFiles() {
  const list = $("files");
  try {
    const { files } = await getJson(base() + "/files");
    clear(list);
    for (const f of files) {
      const download = el("button", { type: "button", class: "download", onclick: () => downloadFile(f.path) }, "Download");
      const remove = el("button", { type: "button", class: "danger remove", onclick: () => removeFile(f.path) }, "Delete");
      list.append(el("li", { "data-path": f.path }, el("span", { class: "name" }, f.path), el("span", { class: "size" }, bytes(f.size)), download, remove));
    }
    $("files-status").textContent = files.length ? "" : "No files yet.";
  } catch (e) {
    fail(e);
  }
}

async function downloadFile(path) {
  try {
    const blob = await (await request("GET", filePath(current.id, path))).blob();
    const url = URL.createObjectURL(new Blob([blob], { type: "application/octet-stream" }));
    const link = el("a", { href: url, download: path.split("/").pop() });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (e) {
    fail(e);
  }
}

async function removeFile(path) {
  try {
    await request("DELETE", filePath(current.id, path));
  } catch (e) {
    fail(e);
  }
  refreshFiles();
}

$("upload-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const files = [...$("upload").files];
  for (const file of files) {
    $("files-status").textContent = "uploading " + file.name + "…";
    try {
      await request("PUT", filePath(current.id, file.name), { body: file });
    } catch (e) {
      fail(e);
    }
  }
  $("upload").value = "";
  refreshFiles();
});

$("files-refresh").addEventListener("click", refreshFiles);

// The terminal: one command at a time, its output streamed.
$("term-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const cmd = $("term-cmd").value;
  if (!cmd.trim()) return;
  $("term-cmd").value = "";
  const out = $("term-out");
  out.append(el("span", { class: "cmd" }, "$ " + cmd + "\n"));
  try {
    await stream(base() + "/commands", { cmd }, (event) => {
      if (event.type === "stdout") out.append(plain(event.text));
      else if (event.type === "stderr" || event.type === "error") {
        out.append(el("span", { class: "err" }, plain(event.text || [event.name, event.value].filter(Boolean).join(": ") + "\n")));
      } else if (event.type === "end") {
        out.append(el("span", { class: "cmd" }, "[exit " + (event.exit_code ?? event.status) + "]\n"));
      }
      out.scrollTop = out.scrollHeight;
    });
  } catch (e) {
    out.append(el("span", { class: "err" }, e.message + "\n"));
  }
  refreshFiles();
});

// --- operations -----------------------------------------------------------------------------

// The samples of an OpenMetrics text, by metric name (labels kept as text).
function parseMetrics(text) {
  const samples = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    if (!samples.has(m[1])) samples.set(m[1], []);
    samples.get(m[1]).push({ labels: m[2] || "", value: Number(m[3]) });
  }
  return samples;
}

const GAUGES = [
  ["corral_sessions_live", "live sessions", String],
  ["corral_pool_ready", "pool ready", String],
  ["corral_runs_in_flight", "runs in flight", String],
  ["corral_runs_waiting", "runs waiting (admission queue)", String],
  ["corral_uploads_waiting", "uploads waiting (upload queue)", String],
  ["corral_memory_committed_bytes", "memory committed", bytes],
  ["corral_memory_budget_bytes", "memory budget", bytes],
  ["corral_result_bytes_held", "result bytes held", bytes],
  ["corral_sandbox_failures_total", "sandbox failures", String],
];

async function refreshOps() {
  try {
    const health = await getJson("/healthz");
    $("health-status").textContent = health.status;
    $("health-status").className = "pill " + health.status;
    // Through a router (docs/scale-out.md) health is the router's: its nodes, no pools; the
    // gauges below are then every node's, summed.
    $("pools").classList.toggle("hidden", !health.pools);
    $("nodes").classList.toggle("hidden", !health.nodes);
    const nodes = $("nodes").tBodies[0];
    clear(nodes);
    for (const n of health.nodes || []) {
      nodes.append(el("tr", {},
        el("td", { class: "mono" }, n.name),
        el("td", {}, n.status),
        el("td", {}, n.sessions_live),
        el("td", {}, n.max_sessions)));
    }
    const pools = $("pools").tBodies[0];
    clear(pools);
    for (const p of health.pools || []) {
      pools.append(el("tr", {},
        el("td", {}, p.image),
        el("td", {}, p.zygote_alive ? "up" : "down"),
        el("td", {}, p.zygote_restarts),
        el("td", {}, p.lean_zygote_alive ? "up" : "down"),
        el("td", {}, p.lean_zygote_restarts)));
    }
    const samples = parseMetrics(await (await request("GET", "/metrics")).text());
    const gauges = $("gauges");
    clear(gauges);
    for (const [name, label, format] of GAUGES) {
      const found = samples.get(name);
      if (!found) continue;
      const total = found.reduce((sum, s) => sum + s.value, 0);
      gauges.append(el("dt", {}, label), el("dd", { "data-metric": name }, format(total)));
    }
    const sandboxes = me.operator
      ? await operatorSandboxes("")
      : (await getJson("/v1/sandboxes")).sandboxes.map((s) => ({ ...s, key_id: me.key_id }));
    const perKey = new Map();
    for (const s of sandboxes) {
      const counts = perKey.get(s.key_id) || { running: 0, paused: 0, dead: 0 };
      counts[s.state] = (counts[s.state] || 0) + 1;
      perKey.set(s.key_id, counts);
    }
    const table = $("per-key").tBodies[0];
    clear(table);
    for (const [k, c] of perKey) {
      table.append(el("tr", {}, el("td", { class: "mono" }, k), el("td", {}, c.running), el("td", {}, c.paused), el("td", {}, c.dead)));
    }
  } catch (e) {
    fail(e);
  }
}

let auditBefore = null;

async function loadAudit(more) {
  const params = new URLSearchParams();
  const set = (name, id) => {
    const v = $(id).value.trim();
    if (v) params.set(name, v);
  };
  if (me.operator) set("key", "audit-key");
  set("session", "audit-session");
  set("kind", "audit-kind");
  set("status", "audit-status");
  params.set("limit", "50");
  if (more && auditBefore !== null) params.set("before", String(auditBefore));
  try {
    const page = await getJson("/v1/audit?" + params);
    const body = $("audit").tBodies[0];
    if (!more) clear(body);
    for (const a of page.entries) {
      body.append(el("tr", {},
        el("td", {}, a.id),
        el("td", {}, new Date(a.at * 1000).toISOString().replace("T", " ").slice(0, 19)),
        el("td", { class: "mono" }, a.key_id),
        el("td", { class: "mono" }, a.session_id || "—"),
        el("td", {}, a.kind),
        el("td", {}, a.status),
        el("td", {}, a.execution_time_ms + " ms"),
        el("td", {}, a.cpu_time_ms + " ms"),
        el("td", {}, bytes(a.peak_memory_bytes)),
        el("td", { class: "mono", title: a.code_sha256 }, a.code_sha256.slice(0, 12))));
    }
    auditBefore = page.next ?? null;
    $("audit-more").classList.toggle("hidden", auditBefore === null);
  } catch (e) {
    fail(e);
  }
}

$("audit-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  loadAudit(false);
});
$("audit-more").addEventListener("click", () => loadAudit(true));

// The decisions of the sandboxes' egress proxies (GET /v1/audit/egress), paged like the
// audit log.
let egressBefore = null;

async function loadEgress(more) {
  const params = new URLSearchParams();
  const set = (name, id) => {
    const v = $(id).value.trim();
    if (v) params.set(name, v);
  };
  if (me.operator) set("key", "egress-key");
  set("session", "egress-session");
  set("decision", "egress-decision");
  set("host", "egress-host");
  params.set("limit", "50");
  if (more && egressBefore !== null) params.set("before", String(egressBefore));
  try {
    const page = await getJson("/v1/audit/egress?" + params);
    const body = $("egress").tBodies[0];
    if (!more) clear(body);
    for (const d of page.entries) {
      body.append(el("tr", { "data-decision": d.decision },
        el("td", {}, d.id),
        el("td", {}, new Date(d.at * 1000).toISOString().replace("T", " ").slice(0, 19)),
        el("td", { class: "mono" }, d.key_id),
        el("td", { class: "mono" }, d.session_id || "—"),
        el("td", { class: "mono" }, d.host),
        el("td", {}, d.port),
        el("td", {}, d.decision),
        el("td", {}, d.reason || "—"),
        el("td", { class: "mono" }, d.address || "—")));
    }
    egressBefore = page.next ?? null;
    $("egress-more").classList.toggle("hidden", egressBefore === null);
  } catch (e) {
    fail(e);
  }
}

$("egress-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  loadEgress(false);
});
$("egress-more").addEventListener("click", () => loadEgress(true));

async function loadKeys() {
  try {
    const { keys } = await getJson("/v1/keys");
    const body = $("keys").tBodies[0];
    clear(body);
    for (const k of keys) {
      const revoke = k.revoked ? null : el("button", { type: "button", class: "danger revoke", onclick: () => revokeKey(k.id) }, "Revoke");
      body.append(el("tr", { "data-id": k.id },
        el("td", { class: "mono" }, k.id),
        el("td", {}, k.name),
        el("td", {}, new Date(k.created_at * 1000).toISOString().slice(0, 10)),
        el("td", {}, k.operator ? "operator" : "key"),
        el("td", {}, (k.revoked ? "revoked" : "live") +
          (k.differs_on ? " (differs on " + k.differs_on.join(", ") + ")" : "")),
        el("td", {}, revoke)));
    }
  } catch (e) {
    fail(e);
  }
}

async function revokeKey(id) {
  try {
    await request("DELETE", "/v1/keys/" + encodeURIComponent(id));
  } catch (e) {
    fail(e);
  }
  loadKeys();
}

$("key-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    const made = await sendJson("POST", "/v1/keys", { name: $("key-name").value });
    $("key-name").value = "";
    $("key-secret-value").textContent = made.secret;
    $("key-secret").classList.remove("hidden");
  } catch (e) {
    fail(e);
  }
  loadKeys();
});

// --- start ----------------------------------------------------------------------------------

identify().then((ok) => ok && route()).catch(fail);
