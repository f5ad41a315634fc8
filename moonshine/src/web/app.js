// moonshine's page: chat over the gateway's own /v1/chat/completions (streamed, SSE), the
// sampling settings, and a view of the mesh from /mesh, polled every 2 s.
// Model text is only ever written with textContent / text nodes: it is never parsed as HTML;
// its Markdown comes from the gateway's POST /render as a tree of whitelisted elements.
// Conversations live in localStorage (list, rename, delete, export as JSON).
"use strict";

const $ = (id) => document.getElementById(id);
const MESH_EVERY_MS = 2000;

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

// ---- conversations (kept in this browser's localStorage) ----

const CONVS_KEY = "moonshine.conversations";
const CURRENT_KEY = "moonshine.current";

// [{id, title, updated, messages: [{role, content, meta?}]}], newest first.
let convs = [];
let current = null;

function loadConvs() {
  try {
    const v = JSON.parse(localStorage.getItem(CONVS_KEY) || "[]");
    convs = Array.isArray(v) ? v.filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages)) : [];
  } catch (_) {
    convs = []; // unreadable: start afresh rather than break the page
  }
  current = localStorage.getItem(CURRENT_KEY);
  if (!convs.some((c) => c.id === current)) current = convs.length ? convs[0].id : null;
}

function persist() {
  try {
    localStorage.setItem(CONVS_KEY, JSON.stringify(convs));
    if (current) localStorage.setItem(CURRENT_KEY, current);
  } catch (e) {
    $("mesh-error").textContent = "could not save the conversation: " + e.message;
    $("mesh-error").hidden = false;
  }
}

function conv() {
  let c = convs.find((x) => x.id === current);
  if (!c) {
    c = { id: String(Date.now()) + Math.random().toString(36).slice(2, 8), title: "", updated: Date.now(), messages: [] };
    convs.unshift(c);
    current = c.id;
  }
  return c;
}

function touch(c) {
  c.updated = Date.now();
  if (!c.title) {
    const first = c.messages.find((m) => m.role === "user");
    if (first) c.title = first.content.slice(0, 48);
  }
  persist();
  renderList();
}

function renderList() {
  const ul = $("conv-list");
  ul.replaceChildren();
  for (const c of convs) {
    const li = el("li", c.id === current ? "conv current" : "conv");
    li.dataset.id = c.id;
    const open = el("button", "title", c.title || "New conversation");
    open.type = "button";
    open.addEventListener("click", () => switchTo(c.id));
    const rename = el("button", "quiet rename", "Rename");
    rename.type = "button";
    rename.addEventListener("click", () => startRename(li, c));
    const del = el("button", "quiet delete", "Delete");
    del.type = "button";
    del.addEventListener("click", () => removeConv(c.id));
    li.append(open, rename, del);
    ul.append(li);
  }
}

function startRename(li, c) {
  const input = el("input", "rename-input");
  input.value = c.title || "";
  input.setAttribute("aria-label", "conversation name");
  li.replaceChildren(input);
  input.focus();
  let done = false;
  const commit = (keep) => {
    if (done) return;
    done = true;
    if (keep) c.title = input.value.trim() || c.title;
    persist();
    renderList();
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") commit(true);
    if (e.key === "Escape") commit(false);
  });
  input.addEventListener("blur", () => commit(true));
}

function removeConv(id) {
  if (running && id === current) running.abort();
  convs = convs.filter((c) => c.id !== id);
  if (id === current) current = convs.length ? convs[0].id : null;
  persist();
  if (!current) localStorage.removeItem(CURRENT_KEY);
  renderConv();
}

function switchTo(id) {
  if (running) running.abort();
  current = id;
  persist();
  renderConv();
}

function newConv() {
  if (running) running.abort();
  current = null;
  localStorage.removeItem(CURRENT_KEY);
  renderConv();
}

// Every conversation as one JSON file, downloaded.
function exportConvs() {
  const blob = new Blob([JSON.stringify({ conversations: convs }, null, 2)], { type: "application/json" });
  const a = el("a");
  a.href = URL.createObjectURL(blob);
  a.download = "moonshine-conversations.json";
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

// ---- Markdown: the gateway renders a tree of whitelisted elements; built here with
// createElement and text nodes, never parsed as HTML ----

const TAGS = new Set(["p", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "pre", "code", "ul",
  "ol", "li", "em", "strong", "del", "a", "hr", "br", "table", "thead", "tbody", "tr", "th", "td", "span"]);

function build(nodes, parent) {
  for (const n of nodes) {
    if (typeof n === "string") {
      parent.append(document.createTextNode(n));
      continue;
    }
    if (!n || !TAGS.has(n.t)) continue;
    const e = document.createElement(n.t);
    if (n.t === "a" && typeof n.href === "string" && /^(https?:|mailto:)/i.test(n.href)) {
      e.href = n.href;
      e.rel = "noopener noreferrer";
      e.target = "_blank";
    }
    if (typeof n.color === "string" && /^#[0-9a-f]{6}$/i.test(n.color)) e.style.color = n.color;
    build(Array.isArray(n.c) ? n.c : [], e);
    if (n.t === "pre") {
      if (typeof n.lang === "string") e.dataset.lang = n.lang;
      const copy = el("button", "quiet copy-code", "Copy code");
      copy.type = "button";
      copy.addEventListener("click", () => copyText(e.querySelector("code") ? e.querySelector("code").textContent : "", copy));
      const wrap = el("div", "code");
      wrap.append(copy, e);
      parent.append(wrap);
      continue;
    }
    parent.append(e);
  }
}

// Renders `text` into `body` through POST /render; `seq` drops answers overtaken by a later call.
async function renderMarkdown(body, text) {
  const seq = (body.renderSeq = (body.renderSeq || 0) + 1);
  try {
    const r = await fetch("/render", { method: "POST", headers: headers(), body: JSON.stringify({ text }) });
    if (!r.ok) return;
    const j = await r.json();
    if (seq !== body.renderSeq || !Array.isArray(j.nodes)) return;
    const frag = document.createDocumentFragment();
    build(j.nodes, frag);
    body.replaceChildren(frag);
    body.classList.remove("plain");
    body.classList.add("md");
  } catch (_) {
    /* the plain text stays */
  }
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch (_) {
    // No clipboard API (plain http from another host): the old way, through a selection.
    const t = el("textarea");
    t.value = text;
    document.body.append(t);
    t.select();
    document.execCommand("copy");
    t.remove();
  }
  const was = button.textContent;
  button.textContent = "Copied";
  setTimeout(() => (button.textContent = was), 1200);
}

// ---- chat ----

function actionButton(label, cls, fn) {
  const b = el("button", "quiet " + cls, label);
  b.type = "button";
  b.addEventListener("click", fn);
  return b;
}

// One message's box: its text (`.body`), its meta line and its actions.
function addMessage(msg, index) {
  $("empty").hidden = true;
  const m = el("div", "msg " + msg.role);
  m.dataset.index = String(index);
  const body = el("div", "body plain");
  body.append(document.createTextNode(msg.content));
  m.append(body);
  if (msg.meta) m.append(el("span", "meta", msg.meta));
  const actions = el("div", "actions");
  actions.append(actionButton("Copy", "copy", (e) => copyText(msg.content, e.target)));
  if (msg.role === "user") actions.append(actionButton("Edit", "edit", () => editFrom(index)));
  else actions.append(actionButton("Regenerate", "regenerate", () => regenerate(index)));
  m.append(actions);
  $("log").append(m);
  if (msg.role === "assistant" && msg.content) renderMarkdown(body, msg.content);
  m.scrollIntoView({ block: "end" });
  return m;
}

function renderConv() {
  const log = $("log");
  log.replaceChildren($("empty"));
  const c = convs.find((x) => x.id === current);
  $("empty").hidden = !!(c && c.messages.length);
  if (c) c.messages.forEach((m, i) => addMessage(m, i));
  renderList();
}

// Edit and resend: the conversation goes back to before that message, its text into the box.
function editFrom(index) {
  if (running) return;
  const c = conv();
  const text = c.messages[index].content;
  c.messages.splice(index);
  touch(c);
  renderConv();
  $("prompt").value = text;
  $("prompt").focus();
}

// Regenerate: the answer at `index` and everything after it go; the turn before is asked again.
function regenerate(index) {
  if (running) return;
  const c = conv();
  c.messages.splice(index);
  touch(c);
  renderConv();
  if (c.messages.length && c.messages[c.messages.length - 1].role === "user") generate(c);
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

function send(text) {
  const c = conv();
  c.messages.push({ role: "user", content: text });
  touch(c);
  addMessage(c.messages[c.messages.length - 1], c.messages.length - 1);
  generate(c);
}

// Streams the answer to the conversation's last user turn into a new assistant box.
async function generate(c) {
  const msg = { role: "assistant", content: "" };
  const box = addMessage(msg, c.messages.length);
  box.classList.add("streaming");
  const body = box.querySelector(".body");
  const out = body.firstChild; // the text node the answer grows in
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of c.messages) messages.push({ role: m.role, content: m.content });
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
  let lastRender = 0;
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
      const ch = (chunk.choices || [])[0];
      if (!ch) return true;
      const piece = ch.delta && ch.delta.content;
      if (piece) {
        if (first === null) first = performance.now();
        msg.content += piece;
        if (body.classList.contains("plain")) out.appendData(piece);
        // Markdown while streaming, a few times a second (each render replaces the last).
        const now = performance.now();
        if (now - lastRender > 400) {
          lastRender = now;
          renderMarkdown(body, msg.content);
        }
        box.scrollIntoView({ block: "end" });
      }
      if (ch.finish_reason) finish = ch.finish_reason;
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
  }
  const parts = [];
  if (finish) parts.push(finish);
  if (usage) parts.push(`${usage.completion_tokens} tokens`);
  if (first !== null) parts.push(`first token ${Math.round(first - t0)} ms`);
  if (usage && first !== null && usage.completion_tokens > 1) {
    const s = (performance.now() - first) / 1000;
    if (s > 0) parts.push(`${((usage.completion_tokens - 1) / s).toFixed(1)} tokens/s`);
  }
  msg.meta = parts.join(" \u00b7 ");
  if (msg.content) {
    c.messages.push(msg);
    touch(c);
    await renderMarkdown(body, msg.content);
  }
  box.classList.remove("streaming");
  box.insertBefore(el("span", "meta", msg.meta), box.querySelector(".actions"));
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
  $("new-conv").addEventListener("click", newConv);
  $("export").addEventListener("click", exportConvs);
  $("api-key").addEventListener("change", () => {
    saveSettings();
    loadModels();
  });
  for (const k of SETTINGS) $(k).addEventListener("change", saveSettings);
  loadConvs();
  renderConv();
  loadModels();
  pollMesh();
});
