// moonshine's page: chat over the gateway's own /v1/chat/completions (streamed, SSE), the
// sampling settings, and a view of the mesh from /mesh, polled every 2 s.
// Model text is only ever written with textContent / text nodes: it is never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const MESH_EVERY_MS = 2000;

// The conversation so far, as the API takes it (the system prompt is added per request).
const history = [];
// The running request's AbortController; Stop aborts it and the gateway stops generating
// when it sees the connection go.
let running = null;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

// An error answer's message: the API's {"error": {"message"}} or the status line.
async function errorText(r) {
  try {
    const j = await r.json();
    if (j && j.error && j.error.message) return `${r.status}: ${j.error.message}`;
  } catch (_) { /* not JSON */ }
  return `${r.status} ${r.statusText}`;
}

// ---- settings ----

const SETTINGS = ["temperature", "top_p", "top_k", "max_tokens", "system"];

function loadSettings() {
  for (const k of SETTINGS) {
    const v = localStorage.getItem("moonshine." + k);
    if (v !== null) $(k).value = v;
  }
  const key = sessionStorage.getItem("moonshine.api-key");
  if (key) $("api-key").value = key;
}

function saveSettings() {
  for (const k of SETTINGS) localStorage.setItem("moonshine." + k, $(k).value);
  sessionStorage.setItem("moonshine.api-key", $("api-key").value);
}

// A number field's value, or undefined when empty or not a number (the gateway's default).
function num(id) {
  const v = $(id).value.trim();
  if (v === "") return undefined;
  const n = Number(v);
  return Number.isFinite(n) ? n : undefined;
}

async function loadModels() {
  const sel = $("model");
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    if (!r.ok) throw new Error(await errorText(r));
    const j = await r.json();
    const keep = sel.value;
    sel.replaceChildren();
    for (const m of j.data || []) sel.append(new Option(m.id, m.id));
    if (keep) sel.value = keep;
    $("model-name").textContent = sel.value;
  } catch (e) {
    $("model-name").textContent = "models: " + e.message;
  }
}

// ---- chat ----

function addMessage(role, text) {
  $("empty").hidden = true;
  const m = el("div", "msg " + role);
  m.append(document.createTextNode(text));
  $("log").append(m);
  m.scrollIntoView({ block: "end" });
  return m;
}

function setRunning(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
}

// Reads a server-sent-event body, calling onData with each `data:` payload.
async function readEvents(body, onData) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data:") && onData(line.slice(5).trim()) === false) return;
      }
    }
  }
}

async function send(text) {
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const box = addMessage("assistant", "");
  box.classList.add("streaming");
  const out = box.firstChild; // the text node the answer grows in
  const meta = el("span", "meta");
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...history);
  const req = {
    model: $("model").value || "default",
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: num("temperature"),
    top_p: num("top_p"),
    top_k: num("top_k"),
    max_tokens: num("max_tokens"),
  };
  running = new AbortController();
  setRunning(true);
  const t0 = performance.now();
  let first = null;
  let finish = null;
  let usage = null;
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(req),
      signal: running.signal,
    });
    if (!r.ok) throw new Error(await errorText(r));
    await readEvents(r.body, (data) => {
      if (data === "[DONE]") return false;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || "station error");
      if (chunk.usage) usage = chunk.usage;
      const c = (chunk.choices || [])[0];
      if (!c) return true;
      const piece = c.delta && c.delta.content;
      if (piece) {
        if (first === null) first = performance.now();
        out.appendData(piece);
        box.scrollIntoView({ block: "end" });
      }
      if (c.finish_reason) finish = c.finish_reason;
      return true;
    });
  } catch (e) {
    if (e.name === "AbortError") {
      finish = "stopped";
    } else {
      box.classList.add("error");
      finish = "error: " + e.message;
    }
  } finally {
    running = null;
    setRunning(false);
    box.classList.remove("streaming");
  }
  if (out.data) history.push({ role: "assistant", content: out.data });
  else history.pop(); // nothing came back: the turn is not kept
  const parts = [];
  if (finish) parts.push(finish);
  if (usage) parts.push(`${usage.completion_tokens} tokens`);
  if (first !== null) parts.push(`first token ${Math.round(first - t0)} ms`);
  if (usage && first !== null && usage.completion_tokens > 1) {
    const s = (performance.now() - first) / 1000;
    if (s > 0) parts.push(`${((usage.completion_tokens - 1) / s).toFixed(1)} tokens/s`);
  }
  meta.textContent = parts.join(" \u00b7 ");
  box.append(meta);
}

// ---- mesh ----

function stat(label, value) {
  const s = el("span", null, label + " ");
  s.append(el("b", null, value));
  return s;
}

function renderMesh(m) {
  $("mesh-error").hidden = true;
  const sum = $("mesh-summary");
  sum.replaceChildren(
    stat("tokens/s", m.tokens_per_s == null ? "\u2013" : m.tokens_per_s.toFixed(1)),
    stat("generating", String(m.generations_active)),
    stat("tokens served", String(m.completion_tokens_total)),
  );
  let down = 0;
  const chains = $("chains");
  chains.replaceChildren();
  m.chains.forEach((c, ci) => {
    const box = el("div", "chain");
    if (m.chains.length > 1) box.append(el("h3", null, "chain " + ci));
    const total = c.hops.reduce((a, h) => a + (h.ms_per_token || 0), 0);
    for (const h of c.hops) {
      if (h.status !== "ok") down++;
      const n = el("div", "node " + h.status);
      n.dataset.url = h.url;
      n.append(el("span", "dot"), el("span", "url", h.url), el("span", "layers", "layers " + h.layers));
      const bits = [h.status];
      if (h.role) bits.push(h.role);
      if (h.sessions != null) bits.push(h.sessions + " sessions");
      if (h.ms_per_token != null) bits.push(h.ms_per_token.toFixed(1) + " ms/token");
      if (h.error) bits.push(h.error);
      n.append(el("span", "detail", bits.join(" \u00b7 ")));
      if (h.ms_per_token != null && total > 0) {
        const bar = el("span", "bar");
        bar.style.width = Math.max(2, (100 * h.ms_per_token) / total) + "%";
        n.append(bar);
      }
      box.append(n);
    }
    chains.append(box);
  });
  const st = $("status");
  st.textContent = down ? `${down} node(s) down` : "mesh ok";
  st.className = "pill " + (down ? "down" : "ok");
  $("mesh-age").textContent = "\u00b7 " + new Date().toLocaleTimeString();
}

async function pollMesh() {
  try {
    const r = await fetch("/mesh", { headers: headers() });
    if (!r.ok) throw new Error(await errorText(r));
    renderMesh(await r.json());
  } catch (e) {
    const p = $("mesh-error");
    p.textContent = "mesh: " + e.message;
    p.hidden = false;
    $("status").textContent = "gateway unreachable";
    $("status").className = "pill down";
  } finally {
    setTimeout(pollMesh, MESH_EVERY_MS);
  }
}

// ---- wiring ----

function submit() {
  const p = $("prompt");
  const text = p.value.trim();
  if (!text || running) return;
  p.value = "";
  saveSettings();
  send(text);
}

document.addEventListener("DOMContentLoaded", () => {
  loadSettings();
  // The settings are a form for the password field's sake; Enter in one must not navigate.
  $("settings").addEventListener("submit", (e) => e.preventDefault());
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    submit();
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      submit();
    }
  });
  $("stop").addEventListener("click", () => running && running.abort());
  $("clear").addEventListener("click", () => {
    if (running) running.abort();
    history.length = 0;
    $("log").replaceChildren($("empty"));
    $("empty").hidden = false;
  });
  $("api-key").addEventListener("change", () => {
    saveSettings();
    loadModels();
  });
  for (const k of SETTINGS) $(k).addEventListener("change", saveSettings);
  loadModels();
  pollMesh();
});
