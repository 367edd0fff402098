// Tenure's dashboard: hash routes, each drawn from the JSON API and drawn
// again whenever the change stream says the state changed.
//
// On a node run with --auth every request needs an ACL token: the page
// asks for one, keeps it in this tab's session storage (never in a URL,
// never in local storage) and sends it as "Authorization: Bearer SECRET"
// on every request, the change stream's included: the stream is read with
// fetch, because EventSource cannot send that header.
"use strict";

const main = document.getElementById("main");
const live = document.getElementById("live");
const tokenInput = document.getElementById("token");
const TOKEN_KEY = "tenure-token";

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

// headers are a request's headers: the bearer token, if one was given.
function headers(extra) {
  const hs = Object.assign({}, extra || {});
  const t = token();
  if (t) hs["Authorization"] = "Bearer " + t;
  return hs;
}

// AuthError: the node wants a (better) token.
class AuthError extends Error {}

// h builds an element: h("td", {class: "num"}, "text", child...). Text is
// always set as text, never as HTML.
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function dur(ms) {
  if (ms === undefined || ms === null || ms < 0) return "?";
  if (ms < 1000) return ms + " ms";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(1) + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m " + Math.floor(s % 60) + "s";
  return Math.floor(m / 60) + "h " + (m % 60) + "m";
}

function clock(unixMs) {
  return new Date(unixMs).toLocaleTimeString([], {hour12: false}) + "." + String(unixMs % 1000).padStart(3, "0");
}

async function api(path) {
  const r = await fetch(path, {cache: "no-store", headers: headers()});
  if (r.status === 401) throw new AuthError(token() ? "this node does not know that token: enter another one above" : "this node needs an ACL token: enter one above");
  if (!r.ok) throw new Error(path + ": " + r.status + " " + (await r.text()));
  return r.json();
}

function table(headers, rows, attrs) {
  return h("table", attrs, h("thead", {}, h("tr", {}, headers.map(x => h("th", {}, x)))), h("tbody", {}, rows));
}

function route() {
  const hash = decodeURIComponent(location.hash.slice(1) || "cluster");
  const i = hash.indexOf("/");
  return i < 0 ? {page: hash, arg: ""} : {page: hash.slice(0, i), arg: hash.slice(i + 1)};
}

// The locks page keeps its filter across redraws.
let lockPrefix = "";

// members draws the cluster's members: their health is the leader's view
// (c.view names it); a follower knows only who they are.
function members(c) {
  const known = !!c.view;
  const rows = (c.members || []).map(m => h("tr", {"data-testid": "member", "data-id": m.id},
    h("td", {}, m.id),
    h("td", {}, m.peer_addr),
    h("td", {}, h("span", {class: "tag"}, m.leader ? "leader" : (m.voter ? "voter" : "non-voter"))),
    h("td", {class: known ? (m.reachable ? "ok" : "bad") : "muted", "data-testid": "reachable"}, known ? (m.reachable ? "reachable" : "unreachable") : "?"),
    h("td", {class: "num"}, known ? m.lag : "?"),
    h("td", {class: "num"}, known ? (m.leader ? "-" : dur(m.last_contact_ms) + " ago") : "?"),
    h("td", {}, m.version || h("span", {class: "muted"}, "?"))));
  return [table(["id", "peer address", "state", "reachable", "lag (entries)", "last contact", "version"], rows, {"data-testid": "members"}),
    known ? null : h("p", {class: "muted"}, "This node is a follower and does not watch its peers: open the leader's dashboard for their reachability, lag and last contact.")];
}

// summary draws the counts of what the state holds.
function summary(s) {
  const row = (k, v) => [h("dt", {}, k), h("dd", {class: "num"}, v || 0)];
  return h("dl", {class: "kv", "data-testid": "summary"},
    row("locks", s.locks), row("locks held", s.held), row("waiters", s.waiters), row("lock-delays", s.delayed),
    row("sessions", s.sessions), row("queues", s.queues),
    row("queue items ready", s.ready), row("in flight", s.inflight), row("dead", s.dead));
}

const pages = {
  async cluster() {
    const c = await api("/api/cluster");
    return [h("h2", {}, "Cluster"), h("dl", {class: "kv", "data-testid": "cluster"},
      h("dt", {}, "node"), h("dd", {"data-testid": "node"}, c.node),
      h("dt", {}, "leader"), h("dd", {"data-testid": "leader"}, c.leader || "none"),
      h("dt", {}, "term"), h("dd", {}, c.term),
      h("dt", {}, "commit index"), h("dd", {}, c.commit_index),
      h("dt", {}, "applied index"), h("dd", {}, c.applied_index),
      h("dt", {}, "revision"), h("dd", {}, c.revision),
      h("dt", {}, "health"), h("dd", {class: c.ready ? "ok" : "bad", "data-testid": "health"}, c.ready ? "ready" : "not ready: " + c.not_ready),
      c.degraded ? [h("dt", {}, "members"), h("dd", {class: "bad", "data-testid": "degraded"}, "degraded: " + c.degraded)] : null,
      h("dt", {}, "voters"), h("dd", {}, (c.voters || []).join(", ")),
      h("dt", {}, "version"), h("dd", {}, c.version)),
      h("h2", {}, "Members"),
      ...members(c),
      h("h2", {}, "Summary"),
      summary(c.summary || {})];
  },

  async locks() {
    const d = await api("/api/locks?prefix=" + encodeURIComponent(lockPrefix));
    const filter = h("input", {type: "text", placeholder: "filter by prefix", value: lockPrefix, "data-testid": "prefix",
      onchange: e => { lockPrefix = e.target.value; refresh(); }});
    const rows = d.locks.map(l => h("tr", {"data-testid": "lock", "data-name": l.name},
      h("td", {}, h("a", {href: "#lock/" + encodeURIComponent(l.name)}, l.name)),
      h("td", {}, h("span", {class: "tag"}, l.kind)),
      h("td", {}, l.holders.length === 0 ? h("span", {class: "muted"}, "free") :
        h("ul", {}, l.holders.map(x => h("li", {"data-testid": "holder"},
          x.owner, " ", h("span", {class: "muted"}, "(" + x.mode + ", session " + x.session + ", token " + x.token + ", held " + dur(x.held_ms) + ")"))))),
      h("td", {}, l.waiters.length === 0 ? h("span", {class: "muted"}, "none") :
        h("ol", {}, l.waiters.map(w => h("li", {"data-testid": "waiter"},
          w.owner, " ", h("span", {class: "muted"}, "(session " + w.session + (w.shared ? ", reader" : "") + ", waiting " + dur(w.wait_ms) + ")"))),
          l.waiter_count > l.waiters.length ? h("li", {class: "muted"}, "... " + (l.waiter_count - l.waiters.length) + " more") : null)),
      h("td", {class: "num"}, l.delay_ms ? "lock-delay " + dur(l.delay_ms) : "")));
    return [h("h2", {}, "Locks"), h("p", {}, filter),
      table(["name", "kind", "holders", "waiters (FIFO)", ""], rows, {"data-testid": "locks"}),
      d.more ? h("p", {class: "muted"}, "more locks than shown: filter by prefix") : null];
  },

  async lock(name) {
    const d = await api("/api/lock?name=" + encodeURIComponent(name));
    const l = d.lock;
    return [h("h2", {}, "Lock ", l.name, " ", h("span", {class: "tag"}, l.kind)),
      h("p", {}, h("a", {href: "#locks"}, "all locks")),
      h("h2", {}, "Grant history"),
      timeline(d.grants, d.now),
      table(["token", "owner", "session", "from", "to", "ended"], d.grants.slice().reverse().map(g => h("tr", {"data-testid": "grant"},
        h("td", {class: "num"}, g.token), h("td", {}, g.owner), h("td", {class: "num"}, g.session),
        h("td", {}, clock(g.at)), h("td", {}, g.ended === "held" ? "now" : clock(g.ended_at)),
        h("td", {}, g.ended))), {"data-testid": "grants"}),
      h("h2", {}, "Now"),
      table(["holders", "waiters (FIFO)"], [h("tr", {},
        h("td", {}, h("ul", {}, l.holders.map(x => h("li", {"data-testid": "holder"}, x.owner + " (" + x.mode + ", token " + x.token + ", held " + dur(x.held_ms) + ")")))),
        h("td", {}, h("ol", {}, l.waiters.map(w => h("li", {"data-testid": "waiter"}, w.owner + " (waiting " + dur(w.wait_ms) + ")")))))])];
  },

  async sessions() {
    const d = await api("/api/sessions");
    const rows = d.sessions.map(s => h("tr", {"data-testid": "session"},
      h("td", {class: "num"}, s.id), h("td", {}, s.owner), h("td", {class: "num"}, dur(s.ttl_ms)),
      h("td", {class: "num"}, s.time_left_ms < 0 ? h("span", {class: "muted", title: "only the leader keeps deadlines"}, "?") : dur(s.time_left_ms)),
      h("td", {}, names(s.held, s.held_count)), h("td", {}, names(s.waiting, s.waiting_count))));
    return [h("h2", {}, "Sessions"), table(["id", "owner", "ttl", "time left", "holds", "waits for"], rows, {"data-testid": "sessions"}),
      d.more ? h("p", {class: "muted"}, "more sessions than shown") : null];
  },

  async queues() {
    const d = await api("/api/queues");
    const rows = d.queues.map(q => h("tr", {"data-testid": "queue"},
      h("td", {}, h("a", {href: "#queue/" + encodeURIComponent(q.name)}, q.name)),
      h("td", {class: "num"}, q.ready), h("td", {class: "num"}, q.inflight), h("td", {class: "num"}, q.dead),
      h("td", {class: "num"}, q.oldest_ready_ms < 0 ? "" : dur(q.oldest_ready_ms))));
    return [h("h2", {}, "Queues"), table(["queue", "ready", "in flight", "dead", "oldest ready"], rows, {"data-testid": "queues"})];
  },

  async queue(name) {
    const d = await api("/api/dead?queue=" + encodeURIComponent(name));
    const requeue = async ids => {
      const r = await fetch("/api/requeue", {method: "POST", headers: headers({"Content-Type": "application/json", "X-Tenure-Dashboard": "1"}),
        body: JSON.stringify({queue: name, ids: ids.map(String)})});
      if (!r.ok) alert(await r.text());
      refresh();
    };
    const rows = d.items.map(it => h("tr", {"data-testid": "dead"},
      h("td", {class: "num"}, it.id), h("td", {class: "num"}, it.attempts), h("td", {class: "num"}, it.size),
      h("td", {}, it.preview), h("td", {}, h("button", {onclick: () => requeue([it.id])}, "requeue"))));
    return [h("h2", {}, "Dead letters of ", name), h("p", {}, h("a", {href: "#queues"}, "all queues"), " ",
      d.items.length ? h("button", {onclick: () => requeue([])}, "requeue all") : null),
      table(["id", "attempts", "bytes", "payload", ""], rows, {"data-testid": "dead-letters"})];
  },

  async elections() {
    const d = await api("/api/elections");
    const rows = d.elections.map(e => h("tr", {"data-testid": "election"},
      h("td", {}, e.name), h("td", {}, e.leader || h("span", {class: "muted"}, "none")),
      h("td", {}, e.value), h("td", {class: "num"}, e.epoch || "")));
    return [h("h2", {}, "Elections"), table(["election", "leader", "value", "epoch"], rows, {"data-testid": "elections"})];
  },
};

function names(list, count) {
  const s = (list || []).join(", ");
  return count > (list || []).length ? s + " ... " + (count - list.length) + " more" : s;
}

// timeline draws a lock's grants as bars on a time axis, one row per
// grant, coloured by how it ended.
function timeline(grants, now) {
  const ns = "http://www.w3.org/2000/svg";
  const s = (tag, attrs, text) => {
    const el = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    return el;
  };
  const rowH = 22, left = 10, right = 10, top = 24;
  const width = Math.max(main.clientWidth - 40, 400);
  const svg = s("svg", {class: "timeline", width, height: top + rowH * Math.max(grants.length, 1) + 10, "data-testid": "timeline"});
  if (grants.length === 0) {
    svg.append(s("text", {x: left, y: top, fill: "#6b7385"}, "no grants recorded"));
    return svg;
  }
  const t0 = Math.min(...grants.map(g => g.at));
  const t1 = Math.max(now, ...grants.map(g => g.ended_at || now));
  const span = Math.max(t1 - t0, 1);
  const x = t => left + (t - t0) / span * (width - left - right);
  svg.append(s("text", {x: left, y: 14, fill: "#6b7385", "font-size": 11}, clock(t0)));
  svg.append(s("text", {x: width - right, y: 14, fill: "#6b7385", "font-size": 11, "text-anchor": "end"}, grants.some(g => g.ended === "held") ? "now" : clock(t1)));
  const colour = {held: "#2f9e6b", released: "#7a8aa8", expired: "#d0453a"};
  grants.forEach((g, i) => {
    const end = g.ended === "held" ? now : g.ended_at;
    const y = top + i * rowH;
    const x0 = x(g.at), w = Math.max(x(end) - x0, 2);
    svg.append(s("rect", {x: x0, y, width: w, height: rowH - 6, rx: 3, fill: colour[g.ended] || "#999", "data-testid": "bar"}));
    const label = "token " + g.token + " · " + g.owner + " · " + g.ended + " after " + dur(end - g.at);
    const inside = w > label.length * 6.5;
    svg.append(s("text", {x: inside ? x0 + 6 : Math.min(x0 + w + 6, width - 4), y: y + rowH - 11, "font-size": 11,
      fill: inside ? "#fff" : "#1d2330", "text-anchor": !inside && x0 + w + 200 > width ? "end" : "start"}, label));
  });
  const legend = h("div", {class: "legend"}, ["held", "released", "expired"].map(k =>
    h("span", {}, h("i", {class: "swatch " + k}), k)));
  return h("div", {}, svg, legend);
}

let drawing = false, again = false;

// refresh draws the current page; a call while one is drawing draws once
// more after it.
async function refresh() {
  if (drawing) { again = true; return; }
  drawing = true;
  try {
    do {
      again = false;
      const {page, arg} = route();
      const draw = pages[page] || pages.cluster;
      let content;
      try {
        content = await draw(arg);
      } catch (e) {
        content = [h("p", {class: "bad", "data-testid": e instanceof AuthError ? "need-token" : "error"}, e instanceof AuthError ? e.message : String(e))];
      }
      const focused = document.activeElement && document.activeElement.dataset.testid;
      main.replaceChildren(...content.filter(Boolean));
      if (focused) { const el = main.querySelector("[data-testid=" + focused + "]"); if (el) el.focus(); }
      for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === page || (page === "lock" && a.dataset.page === "locks") || (page === "queue" && a.dataset.page === "queues"));
    } while (again);
  } finally {
    drawing = false;
  }
}

// The change stream: server-sent events ("event: change", "data: REV")
// read with fetch so that it carries the token. It reconnects after an
// error, and is restarted when the token changes.
let stream = null;

function connect() {
  if (stream) stream.abort();
  const ctl = new AbortController();
  stream = ctl;
  const retry = () => { if (stream === ctl) setTimeout(() => { if (stream === ctl) connect(); }, 2000); };
  (async () => {
    const r = await fetch("/api/events", {cache: "no-store", headers: headers(), signal: ctl.signal});
    if (r.status === 401 || r.status === 403) {
      live.textContent = "no live updates: " + (r.status === 401 ? "needs a token" : "not allowed");
      live.className = "";
      return; // until the token changes
    }
    if (!r.ok || !r.body) throw new Error("events: " + r.status);
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += value;
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        let name = "message", data = "";
        for (const line of ev.split("\n")) {
          if (line.startsWith("event: ")) name = line.slice(7);
          else if (line.startsWith("data: ")) data = line.slice(6);
        }
        if (name === "change") { live.textContent = "live · revision " + data; live.className = "on"; refresh(); }
      }
    }
    throw new Error("events: the stream ended");
  })().catch(() => {
    if (ctl.signal.aborted) return;
    live.textContent = "reconnecting"; live.className = "";
    retry();
  });
}

document.getElementById("login").addEventListener("submit", e => {
  e.preventDefault();
  const t = tokenInput.value.trim();
  if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
  tokenInput.value = "";
  tokenInput.placeholder = t ? "ACL token (one is in use)" : "ACL token";
  refresh();
  connect();
});
document.getElementById("forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  tokenInput.value = "";
  tokenInput.placeholder = "ACL token";
  refresh();
  connect();
});
if (token()) tokenInput.placeholder = "ACL token (one is in use)";

window.addEventListener("hashchange", refresh);
refresh();
connect();
