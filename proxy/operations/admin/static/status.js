// The kipside status page's script: fetches GET /status.json every second and fills in the page.
"use strict";
const $ = (id) => document.getElementById(id);
const num = (x, digits) => (x === null || x === undefined) ? "\u2013" : x.toFixed(digits);
function text(id, value) { $(id).textContent = String(value); }

function render(s) {
  text("client-connections", s.connections.client);
  text("upstream-connections", s.connections.upstream);
  const p = s.produce;
  text("coalescing-ratio", p.coalescing_ratio === null ? "\u2013" : p.coalescing_ratio + " : 1");
  text("coalescing-note", p.client_requests + " client / " + p.upstream_requests +
       " upstream Produce requests; last " + (s.rate_window_seconds || 0) + " s: " +
       (p.recent_coalescing_ratio === null ? "\u2013" : p.recent_coalescing_ratio + " : 1"));
  text("holds", s.holds.holds);
  text("hold-retries", s.holds.hold_retries + " retries while holding");
  text("rules-version", s.rules.version);
  text("rules-source", s.rules.source + " \u00b7 loaded " + s.rules.loaded_at + " \u00b7 " +
       s.rules.reloads + " reloads, " + s.rules.reload_errors + " rejected");
  text("rules-error", s.rules.last_error ?
       "Last reload rejected (the version above stays in force):\n" + s.rules.last_error : "");
  text("window", s.rate_window_seconds ? "(last " + s.rate_window_seconds + " s)" : "");
  const body = $("apis");
  const rows = s.apis.map((a) => {
    const tr = document.createElement("tr");
    for (const v of [a.api, num(a.client_per_second, 1), num(a.upstream_per_second, 1),
                     a.client_requests, a.upstream_requests]) {
      const td = document.createElement("td");
      td.textContent = String(v);
      tr.appendChild(td);
    }
    return tr;
  });
  if (rows.length) { body.replaceChildren(...rows); }
  text("uptime", "kipside " + s.kipside_version + ", up " + Math.round(s.uptime_seconds) + " s");
}

async function refresh() {
  const state = $("state");
  try {
    const response = await fetch("/status.json", {cache: "no-store"});
    if (!response.ok) { throw new Error("HTTP " + response.status); }
    const s = await response.json();
    render(s);
    state.textContent = s.ready ? "live" : "live, not ready";
    state.className = s.ready ? "live" : "bad";
    text("updated", "updated " + new Date().toLocaleTimeString());
    document.body.dataset.updates = String(Number(document.body.dataset.updates) + 1);
  } catch (err) {
    state.textContent = "no answer from kipside (" + err.message + "); retrying";
    state.className = "bad";
  }
}

async function loop() { await refresh(); setTimeout(loop, 1000); }
loop();
