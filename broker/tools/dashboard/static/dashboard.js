// dledger-dashboard: polls /api/live every 2 s, updates the replica table in place and draws
// rolling SVG charts (no libraries, no network besides the dashboard itself).
"use strict";
(function () {
  const POINTS = 90;
  const series = { tps: [], lag: [], terms: [] };
  const lastRole = {};

  function draw(id, values) {
    const svg = document.getElementById(id);
    if (!svg) return;
    const max = Math.max(1, ...values);
    const step = 300 / (POINTS - 1);
    const pts = values.map((v, i) => `${(i * step).toFixed(1)},${(95 - (v / max) * 85).toFixed(1)}`);
    const last = values.length ? values[values.length - 1] : 0;
    svg.innerHTML = `<polyline points="${pts.join(" ")}"></polyline>` +
      `<text x="2" y="9">max ${max.toFixed(1)}</text><text x="230" y="9" class="last">now ${last.toFixed(1)}</text>`;
    svg.setAttribute("data-last", String(last));
  }

  function push(name, value) {
    const s = series[name];
    s.push(value);
    if (s.length > POINTS) s.shift();
    draw(`chart-${name}`, s);
  }

  function note(text) {
    const ul = document.getElementById("events");
    if (!ul) return;
    const li = document.createElement("li");
    li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
    ul.insertBefore(li, ul.firstChild);
    while (ul.children.length > 50) ul.removeChild(ul.lastChild);
  }

  function updateMembers(members) {
    const body = document.querySelector("#members tbody");
    if (!body) return;
    const cols = ["cluster", "broker_name", "self_id", "broker_id", "addr", "role", "term", "leader_id",
      "writable", "commit_index", "applied_index", "lag"];
    const rows = members.map((m) => "<tr>" + cols.map((c) => {
      const v = m[c] === null || m[c] === undefined ? "-" : String(m[c]);
      const td = document.createElement("td");
      td.textContent = v;
      return td.outerHTML;
    }).join("") + "</tr>");
    body.innerHTML = rows.join("");
    for (const m of members) {
      const key = `${m.broker_name}/${m.self_id || m.addr}`;
      const role = String(m.role);
      if (lastRole[key] !== undefined && lastRole[key] !== role) {
        note(`${key}: ${lastRole[key]} -> ${role}`);
      }
      lastRole[key] = role;
    }
  }

  async function poll() {
    try {
      const resp = await fetch("/api/live", { cache: "no-store" });
      if (resp.ok) {
        const data = await resp.json();
        updateMembers(data.members);
        const sum = (o) => Object.values(o).reduce((a, b) => a + b, 0);
        push("tps", sum(data.tps));
        push("lag", sum(data.lag));
        push("terms", sum(data.terms));
        document.body.setAttribute("data-polls", String(Number(document.body.getAttribute("data-polls") || 0) + 1));
      }
    } catch (e) {
      note(`poll failed: ${e}`);
    }
    setTimeout(poll, 2000);
  }
  poll();
})();
