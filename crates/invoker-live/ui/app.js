// The live view: reads /v1/live (server-sent events, with the admin key as basic auth, so
// fetch, not EventSource) and keeps the page in step with each event. The key stays in this
// tab's sessionStorage; the page itself carries none.
"use strict";

const $ = (id) => document.getElementById(id);
const containers = new Map(); // id -> {row, el}
const groups = new Map(); // action -> {el, cells, count}
let pending = null; // the last pool event, drawn at the next frame
let stats = { events: 0, applyMs: 0, bytes: 0 };

function keyFromFragment() {
  const m = location.hash.match(/key=([^&]+)/);
  if (!m) return null;
  history.replaceState(null, "", location.pathname);
  return decodeURIComponent(m[1]);
}

function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  return s < 120 ? `${s} s` : s < 7200 ? `${Math.round(s / 60)} min` : `${Math.round(s / 3600)} h`;
}

function group(action) {
  let g = groups.get(action);
  if (g) return g;
  const el = document.createElement("div");
  el.className = "action";
  el.dataset.action = action;
  const title = document.createElement("h3");
  title.textContent = action + " ";
  const count = document.createElement("small");
  title.appendChild(count);
  const cells = document.createElement("div");
  cells.className = "cells";
  el.append(title, cells);
  $("containers").appendChild(el);
  g = { el, cells, count, size: 0 };
  groups.set(action, g);
  return g;
}

function describe(row) {
  let text = `#${row.id} ${row.action} on ${row.node}, ${row.memory_mb} MB, ${row.state}`;
  if (row.provisioned) text += " (provisioned)";
  if (row.running > 0) text += `, ${row.running} running`;
  text += `, created ${ago(row.created_ms)} ago`;
  if (row.idle_since_ms) text += `, idle ${ago(row.idle_since_ms)}`;
  if (row.keep_until_ms) text += `, kept until ${new Date(row.keep_until_ms).toLocaleTimeString()}`;
  return text;
}

function upsert(row) {
  let c = containers.get(row.id);
  if (!c) {
    const el = document.createElement("div");
    el.dataset.id = row.id;
    const g = group(row.action);
    g.cells.appendChild(el);
    g.size += 1;
    g.count.textContent = `${g.size}`;
    c = { row, el, action: row.action };
    containers.set(row.id, c);
  }
  c.row = row;
  c.el.className = `c s-${row.state}${row.provisioned ? " provisioned" : ""}`;
  c.el.dataset.state = row.state;
  c.el.textContent = row.running > 1 ? `${row.running}` : "";
  c.el.title = describe(row);
}

function gone(id) {
  const c = containers.get(id);
  if (!c) return;
  containers.delete(id);
  c.el.remove();
  const g = groups.get(c.action);
  g.size -= 1;
  g.count.textContent = `${g.size}`;
  if (g.size === 0) {
    g.el.remove();
    groups.delete(c.action);
  }
}

function drawPool(pool) {
  $("counts").textContent =
    `${containers.size}: ${pool.busy} busy, ${pool.idle} warm, ${pool.starting} starting, ` +
    `${pool.prewarm} prewarm, ${pool.removing} removing`;
  $("waiting-count").textContent = `${pool.waiting}`;
  const nodes = document.createDocumentFragment();
  for (const n of pool.nodes) {
    const cap = Math.max(1, n.capacity_mb);
    const idle = n.idle_mb;
    const busy = Math.max(0, n.committed_mb - idle - n.reserved_mb);
    const buffer = Math.max(0, n.free_mb - n.launchable_mb);
    const parts = [["busy", busy], ["idle", idle], ["reserved", n.reserved_mb], ["removing", n.removing_mb],
      ["buffer", buffer], ["free", n.launchable_mb]];
    const el = document.createElement("div");
    el.className = "node";
    el.dataset.node = n.node;
    el.innerHTML = `<span class="name"></span><span class="numbers"></span><div class="bar"></div>`;
    el.querySelector(".name").textContent = n.node + (n.stale ? " (stats stale)" : "");
    el.querySelector(".numbers").textContent =
      `${n.capacity_mb} MB: ${busy} running, ${idle} warm, ${n.reserved_mb} starting, ${n.launchable_mb} launchable`;
    const bar = el.querySelector(".bar");
    for (const [kind, mb] of parts) {
      if (mb <= 0) continue;
      const s = document.createElement("span");
      s.className = kind;
      s.style.width = `${(100 * mb) / cap}%`;
      s.title = `${kind}: ${mb} MB`;
      bar.appendChild(s);
    }
    nodes.appendChild(el);
  }
  $("nodes").replaceChildren(nodes);
  const queue = document.createDocumentFragment();
  for (const w of pool.queue) {
    const li = document.createElement("li");
    li.textContent = `${w.action} (${w.activation_id.slice(0, 12)}…), waiting ${w.waited_ms} ms${w.queued ? ", queued (asynchronous)" : ""}`;
    queue.appendChild(li);
  }
  $("queue").replaceChildren(queue);
  const controlled = document.createDocumentFragment();
  for (const a of pool.actions || []) {
    const tr = document.createElement("tr");
    const cells = [a.action, a.cap ?? "", a.running, a.waiting,
      a.provisioned ? `${a.provisioned_up} of ${a.provisioned}` : ""];
    for (const v of cells) {
      const td = document.createElement("td");
      td.textContent = `${v}`;
      tr.appendChild(td);
    }
    controlled.appendChild(tr);
  }
  $("controlled").replaceChildren(controlled);
  $("controls").hidden = !(pool.actions && pool.actions.length);
}

function drawInvokers(data) {
  $("scheduler").hidden = false;
  for (const el of document.querySelectorAll(".pool")) el.hidden = true;
  $("scheduler-id").textContent = `(scheduler ${data.scheduler}: ${data.invokers.length})`;
  const rows = document.createDocumentFragment();
  for (const inv of data.invokers) {
    const tr = document.createElement("tr");
    tr.dataset.invoker = inv.id;
    const nodes = inv.nodes ?? [];
    const sum = (f) => nodes.reduce((t, n) => t + (n[f] ?? 0), 0);
    const [cap, free, idle, launchable] = [sum("capacity_mb"), sum("free_mb"), sum("idle_mb"), sum("launchable_mb")];
    let health = inv.health;
    if (inv.drained) health += ", drained";
    if (inv.stalled) health += ", stalled";
    const cells = [inv.id, health, inv.in_flight, inv.containers, (inv.tags ?? []).join(", ")];
    for (const [i, v] of cells.entries()) {
      const td = document.createElement("td");
      td.textContent = `${v}`;
      if (i === 1) td.className = inv.stalled ? "stalled" : inv.drained ? "drained" : inv.health;
      tr.appendChild(td);
    }
    const td = document.createElement("td");
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.title = `${cap} MB: ${launchable} launchable, ${idle} warm`;
    const parts = [["busy", cap - free - idle], ["idle", idle], ["buffer", free - launchable], ["free", launchable]];
    for (const [kind, mb] of parts) {
      if (mb <= 0 || cap <= 0) continue;
      const span = document.createElement("span");
      span.className = kind;
      span.style.width = `${(100 * mb) / cap}%`;
      bar.appendChild(span);
    }
    td.appendChild(bar);
    tr.appendChild(td);
    rows.appendChild(tr);
  }
  $("invokers").tBodies[0].replaceChildren(rows);
}

const capacityGroups = new Map(); // name -> {history, el}
const HOUR_MS = 3600 * 1000;

function chart(history) {
  const w = 600, h = 180, pad = 30;
  const now = Date.now();
  const x = (t) => pad + ((t - (now - HOUR_MS)) / HOUR_MS) * (w - 2 * pad);
  const mb = Math.max(1, ...history.map((s) => Math.max(s.demand_mb, s.target_mb)));
  const inv = Math.max(1, ...history.map((s) => s.active + s.provisioning + s.draining));
  const y = (v, top) => h - pad + 10 - (v / top) * (h - pad - 10);
  const line = (cls, f, top) =>
    `<polyline class="${cls}" points="${history.map((s) => `${x(s.at_ms).toFixed(1)},${y(f(s), top).toFixed(1)}`).join(" ")}"/>`;
  return `<svg viewBox="0 0 ${w} ${h}" preserveAspectRatio="none">` +
    `<text x="2" y="12">${mb} MB</text><text x="${w - pad + 2}" y="12">${inv}</text>` +
    `<text x="${pad}" y="${h - 4}">-60 min</text><text x="${w - pad - 20}" y="${h - 4}">now</text>` +
    line("demand", (s) => s.demand_mb, mb) + line("target", (s) => s.target_mb, mb) +
    line("invokers", (s) => s.active + s.provisioning + s.draining, inv) + "</svg>";
}

function drawCapacity(data) {
  $("capacity").hidden = false;
  for (const el of document.querySelectorAll(".pool")) el.hidden = true;
  $("capacity-state").textContent = data.leader ? "(the active manager)" : "(standby)";
  if (data.snapshot) {
    capacityGroups.clear();
    $("groups").replaceChildren();
  }
  for (const g of data.groups) {
    let known = capacityGroups.get(g.name);
    if (!known) {
      const el = document.createElement("div");
      el.className = "group";
      el.dataset.group = g.name;
      $("groups").appendChild(el);
      known = { history: [], el };
      capacityGroups.set(g.name, known);
    }
    known.history.push(...g.history);
    const oldest = Date.now() - HOUR_MS;
    while (known.history.length && known.history[0].at_ms < oldest) known.history.shift();
    const c = g.counts;
    known.el.innerHTML = `<h3></h3>${chart(known.history)}<ol class="decisions"></ol>`;
    known.el.querySelector("h3").textContent =
      `${g.name} (${g.predictor}): demand ${g.demand_mb} MB, target ${g.target_mb} MB = ${g.target_invokers} invokers; ` +
      `${c.active} active, ${c.provisioning} provisioning, ${c.draining} draining, ${c.removing} removing`;
    const list = known.el.querySelector("ol");
    for (const d of g.decisions) {
      const li = document.createElement("li");
      li.textContent = `${new Date(d.at_ms).toLocaleTimeString()} ${d.action}: ${d.reason}`;
      list.appendChild(li);
    }
  }
}

function activation(a) {
  const tr = document.createElement("tr");
  const cells = [a.action, a.status, a.start ?? "", a.wait_ms ?? "", a.init_ms ?? "", a.duration_ms,
    new Date(a.end_ms).toLocaleTimeString()];
  for (const [i, v] of cells.entries()) {
    const td = document.createElement("td");
    td.textContent = i >= 3 && i <= 5 && v !== "" ? `${v} ms` : `${v}`;
    if (i === 1 && v !== "success") td.className = "bad";
    tr.appendChild(td);
  }
  tr.title = a.id;
  const body = $("activations").tBodies[0];
  body.insertBefore(tr, body.firstChild);
  while (body.rows.length > 50) body.deleteRow(body.rows.length - 1);
}

function apply(kind, data) {
  const began = performance.now();
  switch (kind) {
    case "snapshot":
      containers.clear();
      groups.clear();
      $("containers").replaceChildren();
      for (const row of data.containers) upsert(row);
      pending = data.pool;
      break;
    case "container": upsert(data); break;
    case "gone": gone(data.id); break;
    case "pool": pending = data; break;
    case "activation": activation(data); break;
    case "invokers": drawInvokers(data); break;
    case "capacity": drawCapacity(data); break;
  }
  stats.events += 1;
  stats.applyMs += performance.now() - began;
  document.body.dataset.events = `${stats.events}`;
  document.body.dataset.applyMs = stats.applyMs.toFixed(1);
}

function frame() {
  if (pending) {
    drawPool(pending);
    pending = null;
  }
  document.body.dataset.containers = `${containers.size}`;
  requestAnimationFrame(frame);
}

async function watch(key) {
  const state = $("connection");
  for (;;) {
    try {
      const response = await fetch("/v1/live", { headers: { Authorization: "Basic " + btoa(key) } });
      if (response.status === 401 || response.status === 403) {
        state.dataset.state = "error";
        state.textContent = `the key was refused (${response.status})`;
        sessionStorage.removeItem("invoker-admin-key");
        return;
      }
      if (!response.ok) throw new Error(`${response.status}`);
      state.dataset.state = "live";
      state.textContent = "live";
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        stats.bytes += value.length;
        document.body.dataset.bytes = `${stats.bytes}`;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let kind = "message", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event: ")) kind = line.slice(7);
            else if (line.startsWith("data: ")) data += line.slice(6);
          }
          if (data) apply(kind, JSON.parse(data));
        }
      }
      throw new Error("the stream ended");
    } catch (e) {
      state.dataset.state = "error";
      state.textContent = `reconnecting (${e.message})`;
      await new Promise((r) => setTimeout(r, 2000));
    }
  }
}

function start(key) {
  sessionStorage.setItem("invoker-admin-key", key);
  $("login").hidden = true;
  watch(key);
}

$("login").addEventListener("submit", (e) => {
  e.preventDefault();
  const key = $("key").value.trim();
  if (key) start(key);
});
requestAnimationFrame(frame);
const known = keyFromFragment() ?? sessionStorage.getItem("invoker-admin-key");
if (known) start(known);
