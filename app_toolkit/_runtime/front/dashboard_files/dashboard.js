// The app_toolkit dashboard: renders each state the proxy sends on dashboard/events.
// Everything from the server is inserted as text, never as HTML.
"use strict";

const POINTS = 120; // samples kept per chart (about two minutes at one per second)
const series = new Map(); // "app route" -> {rate: [], p50: [], p99: []}

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "class") node.className = value;
    else if (key === "data") for (const [k, v] of Object.entries(value)) node.dataset[k] = v;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function tone(status) {
  if (["RUNNING", "HEALTHY"].includes(status)) return "ok";
  if (["DEPLOY_FAILED", "UNHEALTHY"].includes(status)) return "bad";
  return "warn";
}

function badge(status) {
  return el("span", { class: `badge ${tone(status)}`, data: { status } }, status);
}

function table(head, rows) {
  const header = el("tr", {}, ...head.map(([label, cls]) => el("th", cls ? { class: cls } : {}, label)));
  return el("div", { class: "scroll" }, el("table", {}, el("thead", {}, header), el("tbody", {}, ...rows)));
}

function number(value, digits = 0) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

function metrics(values) {
  // Custom metrics, metric -> replica -> value: each metric's largest value and replicas.
  return Object.entries(values || {})
    .map(([name, byReplica]) => {
      const all = Object.values(byReplica);
      return `${name} ≤ ${number(Math.max(...all), 2)} (${all.length} replicas)`;
    })
    .join(", ");
}

function scaling(auto) {
  if (!auto) return "fixed";
  let text = `load ${number(auto.current_load, 1)} (avg ${number(auto.average_load, 1)})`;
  if (auto.policy) {
    const seen = metrics(auto.metrics);
    text += `; policy ${auto.policy}${seen ? ` saw ${seen}` : ""}`;
  }
  if (auto.last_decision_to === null) return text;
  const age = Math.round(auto.last_decision_age_s);
  const why = auto.last_decision_metrics ? ` on ${metrics(auto.last_decision_metrics)}` : "";
  return `${text}; last ${auto.last_decision_from}→${auto.last_decision_to}${why} ${age} s ago`;
}

function renderApp(app) {
  const deployments = app.deployments.map((d) =>
    el(
      "tr",
      { data: { deployment: d.name } },
      el("td", {}, d.name),
      el("td", {}, badge(d.status)),
      el("td", { class: "num" }, `${d.running_replicas}/${d.target_replicas}`),
      el("td", { class: "num" }, number(d.queued)),
      el("td", {}, scaling(d.autoscaling)),
    ),
  );
  const notes = (d) => [d.upgrade, d.message].filter((text) => text);
  const messages = app.deployments.flatMap((d) =>
    notes(d).map((text) => el("tr", {}, el("td", { class: "message", colspan: "5" }, `${d.name}: ${text}`))),
  );
  const replicas = app.deployments.flatMap((d) =>
    d.replicas.map((r) =>
      el(
        "tr",
        { class: "replica", data: { replica: r.replica_id, state: r.state } },
        el("td", {}, el("code", {}, r.replica_id)),
        el("td", { class: "wide" }, d.name),
        el("td", {}, badge(r.state)),
        el("td", {}, r.node_id ? r.node_id.slice(0, 10) : "–"),
        el("td", { class: "num" }, number(r.ongoing)),
      ),
    ),
  );
  return el(
    "article",
    { class: "app", data: { app: app.name } },
    el(
      "div",
      { class: "app-head" },
      el("h3", {}, app.name),
      badge(app.status),
      el("span", { class: "muted" }, app.route_prefix === null ? "no HTTP route" : app.route_prefix),
    ),
    app.message ? el("p", { class: "message bad" }, app.message) : null,
    table(
      [["Deployment"], ["Status"], ["Replicas", "num"], ["Queued", "num"], ["Autoscaling"]],
      [...deployments, ...messages],
    ),
    table([["Replica"], ["Deployment", "wide"], ["State"], ["Node"], ["Ongoing", "num"]], replicas),
  );
}

function record(routes) {
  const seen = new Set();
  for (const route of routes) {
    const key = `${route.application} ${route.route}`;
    seen.add(key);
    let s = series.get(key);
    if (!s) series.set(key, (s = { rate: [], p50: [], p99: [] }));
    s.rate.push(route.rate);
    s.p50.push(route.p50_ms);
    s.p99.push(route.p99_ms);
    for (const values of Object.values(s)) if (values.length > POINTS) values.shift();
  }
  for (const key of series.keys()) if (!seen.has(key)) series.delete(key);
}

function draw(canvas, lines) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 300;
  const height = canvas.clientHeight || 48;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, width, height);
  const all = lines.flatMap(([values]) => values.filter((v) => v !== null));
  const top = Math.max(...all, 0) * 1.15 || 1;
  const step = width / (POINTS - 1);
  for (const [values, color] of lines) {
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let drawing = false;
    const offset = POINTS - values.length;
    values.forEach((value, i) => {
      if (value === null) {
        drawing = false;
        return;
      }
      const x = (offset + i) * step;
      const y = height - 2 - (value / top) * (height - 4);
      if (drawing) ctx.lineTo(x, y);
      else ctx.moveTo(x, y);
      drawing = true;
    });
    ctx.stroke();
  }
  canvas.dataset.top = String(top);
}

function color(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function renderRoutes(routes) {
  const box = document.getElementById("routes");
  if (!routes.length) {
    box.replaceChildren(el("p", { class: "muted" }, "No requests through this proxy yet."));
    return;
  }
  const cards = routes.map((route) => {
    const s = series.get(`${route.application} ${route.route}`);
    const rate = el("canvas", { class: "rate-chart", "aria-label": "requests per second" });
    const latency = el("canvas", { class: "latency-chart", "aria-label": "latency p50 and p99" });
    const card = el(
      "div",
      { class: "route", data: { app: route.application, route: route.route } },
      el("h3", {}, route.route || "/", " ", el("span", { class: "muted" }, `(${route.application})`)),
      el(
        "div",
        { class: "figures" },
        el("span", { class: "rate" }, `${number(route.rate, 1)} req/s`),
        el("span", { class: "p50" }, `p50 ${number(route.p50_ms, 1)} ms`),
        el("span", { class: "p99" }, `p99 ${number(route.p99_ms, 1)} ms`),
        el("span", { class: "muted" }, `${route.total} total`),
      ),
      rate,
      latency,
    );
    card.dataset.rate = String(route.rate);
    return [card, () => {
      draw(rate, [[s.rate, color("--rate")]]);
      draw(latency, [[s.p50, color("--p50")], [s.p99, color("--p99")]]);
    }];
  });
  box.replaceChildren(el("div", { class: "routes" }, ...cards.map(([card]) => card)));
  for (const [, paint] of cards) paint();
}

function renderEvents(events) {
  const items = events
    .slice()
    .reverse()
    .map((e) =>
      el(
        "li",
        { class: e.level === "INFO" ? "" : e.level === "ERROR" ? "bad" : "warn", title: e.message },
        el("time", {}, new Date(e.time * 1000).toLocaleTimeString()),
        `${e.level} ${e.message}`,
      ),
    );
  document
    .getElementById("events")
    .replaceChildren(...(items.length ? items : [el("li", { class: "muted" }, "None yet.")]));
}

function render(state) {
  const controller = document.getElementById("controller");
  controller.hidden = !state.controller;
  controller.textContent = state.controller
    ? `Controller: ${state.controller}. Applications and events are as last seen.`
    : "";
  if (!state.controller) {
    const apps = state.applications.map(renderApp);
    const none = el("p", { class: "muted" }, "No applications.");
    document.getElementById("apps").replaceChildren(apps.length ? el("div", { class: "apps" }, ...apps) : none);
    renderEvents(state.events);
  }
  record(state.routes);
  renderRoutes(state.routes);
  document.getElementById("updated").textContent = `updated ${new Date(state.time * 1000).toLocaleTimeString()}`;
}

function connect() {
  const connection = document.getElementById("connection");
  const source = new EventSource("dashboard/events");
  source.onopen = () => {
    connection.textContent = "live";
    connection.className = "badge ok";
  };
  source.onerror = () => {
    connection.textContent = "reconnecting…";
    connection.className = "badge warn";
  };
  source.onmessage = (message) => render(JSON.parse(message.data));
}

// A token given in the address has been turned into a cookie: keep it out of the history.
if (new URLSearchParams(location.search).has("token")) history.replaceState(null, "", location.pathname);
connect();
