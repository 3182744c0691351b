// topiclake console: a small single-page app over the HTTP API (docs/CONSOLE.md).
// Every value shown comes from the API, called with the key the user logged in with (kept in
// sessionStorage only). The DOM is built with textContent, never from HTML strings: topic names,
// keys and values are user data.

const KEY = "topiclake.key";
const PAGE_SIZE = 50;
const main = document.getElementById("main");
const banner = document.getElementById("banner");
let charts = [];
let timers = [];
let streamAbort = null;
let notice = null; // a success to show once the next page has drawn

// -- the DOM ------------------------------------------------------------------------------------
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// Each navigation has a number; a page that finishes after the user went elsewhere draws nothing
// (its show() throws Stale, which guarded() swallows).
let navSeq = 0;
class Stale extends Error {}

function show(seq, ...nodes) {
  if (seq !== navSeq) throw new Stale();
  for (const c of charts) c.destroy();
  charts = [];
  main.replaceChildren(...nodes);
}

function say(message, ok = false) {
  banner.textContent = message;
  banner.className = ok ? "ok" : "";
  banner.hidden = !message;
}

// -- the API --------------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, { json, body, query } = {}) {
  const headers = { Accept: "application/json" };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
  }
  let url = path;
  if (query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
    if ([...q].length) url += `?${q}`;
  }
  let r;
  try {
    r = await fetch(url, { method, headers, body });
  } catch {
    throw new ApiError(0, "NO_ANSWER", OFFLINE);
  }
  if (r.status === 204) return null;
  const text = await r.text();
  let doc = null;
  try { doc = text ? JSON.parse(text) : null; } catch { doc = null; }
  if (!r.ok) {
    const err = doc && doc.error ? doc.error : { code: String(r.status), message: text || r.statusText };
    if (r.status === 401) showLogin(err.message);
    throw new ApiError(r.status, err.code, err.message);
  }
  return { doc, headers: r.headers };
}

const OFFLINE = "The server did not answer: check that it is running and reachable, then reload the page.";
const get = async (path, query) => (await api("GET", path, { query })).doc;
const enc = encodeURIComponent;

// a failed call shows the API's own message in the banner
function guarded(fn) {
  return async (...args) => {
    try {
      say("");
      await fn(...args);
    } catch (e) {
      if (e instanceof Stale || (e instanceof ApiError && e.status === 401)) return;
      say(e instanceof ApiError ? `${e.message} (${e.code})` : String(e.message || e));
    }
  };
}

// -- login ----------------------------------------------------------------------------------------
function showLogin(message) {
  sessionStorage.removeItem(KEY);
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  const input = h("input", { type: "password", id: "api-key", autocomplete: "off", placeholder: "API key" });
  const form = h(
    "form",
    {
      class: "panel login",
      onsubmit: (ev) => {
        ev.preventDefault();
        sessionStorage.setItem(KEY, input.value);
        say("");
        route();
      },
    },
    h("h1", {}, "Log in"),
    h("p", { class: "muted" }, "This server needs an API key. It is kept in this browser tab only."),
    input,
    h("div", { class: "row" }, h("button", { type: "submit", id: "login" }, "Log in")),
  );
  show(navSeq, form);
  say(message || "");
  input.focus();
}

document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  showLogin("Logged out.");
});

// -- formatting ---------------------------------------------------------------------------------
const fmt = new Intl.NumberFormat("en");
function bytes(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}
function duration(ms) {
  const n = Number(ms);
  if (!Number.isFinite(n) || n < 0) return "forever";
  for (const [u, d] of [["d", 86400000], ["h", 3600000], ["min", 60000], ["s", 1000]]) if (n >= d && n % d === 0) return `${n / d} ${u}`;
  return `${n} ms`;
}

// a record's timestamp (epoch ms; another engine may have stored anything, or none)
function when(ms) {
  return Number.isFinite(ms) && Math.abs(ms) <= 8.64e15 ? new Date(ms).toISOString() : String(ms);
}

// long values are shown in part: the page stays fast with megabyte records
const CLIP = 8192;
function clip(text) {
  return text.length > CLIP ? `${text.slice(0, CLIP)}... (${text.length - CLIP} more characters)` : text;
}

// base64 (the API's binary format) -> bytes, and the detected form of those bytes
function fromBase64(b64) {
  if (b64 === null || b64 === undefined) return null;
  const s = atob(b64);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}
const utf8 = new TextDecoder("utf-8", { fatal: true });
function hex(b) {
  return Array.from(b.slice(0, 4096), (x) => x.toString(16).padStart(2, "0")).join(" ") + (b.length > 4096 ? " ..." : "");
}
// Confluent's framing: byte 0, a 4-byte schema id, then Avro binary (or JSON text)
function framedId(b) {
  return b && b.length >= 5 && b[0] === 0 ? new DataView(b.buffer, b.byteOffset + 1, 4).getInt32(0) : null;
}

// Schemas by id, from the registry (GET /registry/schemas/ids/{id}), fetched once per page.
const schemas = new Map();
async function loadSchemas(ids) {
  await Promise.all([...new Set(ids)].filter((id) => id !== null && !schemas.has(id)).map(async (id) => {
    const doc = await get(`/registry/schemas/ids/${id}`).catch(() => null);
    schemas.set(id, doc ? { type: doc.schemaType || "AVRO", schema: JSON.parse(doc.schema) } : null);
  }));
}

function avroNames(s, named, ns = "") {
  if (Array.isArray(s)) { for (const x of s) avroNames(x, named, ns); return; }
  if (!s || typeof s !== "object") return;
  if (["record", "error", "enum", "fixed"].includes(s.type) && s.name) {
    const full = s.name.includes(".") ? s.name : (s.namespace || ns) ? `${s.namespace || ns}.${s.name}` : s.name;
    named[full] = s;
    named[s.name] = named[s.name] || s;
    ns = full.includes(".") ? full.slice(0, full.lastIndexOf(".")) : ns;
  }
  for (const f of s.fields || []) avroNames(f.type, named, ns);
  avroNames(s.items, named, ns);
  avroNames(s.values, named, ns);
  if (typeof s.type === "object") avroNames(s.type, named, ns);
}

// Avro binary -> a JSON-ready value (unions as their branch's value), per the writer's schema.
function avroDecode(schema, bytes) {
  const named = {};
  avroNames(schema, named);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let pos = 0;
  const need = (n) => { if (n < 0 || pos + n > bytes.length) throw new Error("truncated or malformed Avro value"); };
  let items = 0; // a crafted block count of zero-byte items must not hang the page
  const item = () => { if (++items > 100000) throw new Error("more than 100,000 Avro items"); };
  const long = () => {
    let n = 0n, shift = 0n, b;
    do { need(1); b = bytes[pos++]; n |= BigInt(b & 0x7f) << shift; shift += 7n; } while (b & 0x80);
    const v = (n >> 1n) ^ -(n & 1n);
    return Number.isSafeInteger(Number(v)) ? Number(v) : v.toString();
  };
  const blob = () => { const n = long(); need(n); const out = bytes.subarray(pos, pos + n); pos += n; return out; };
  const blocks = (each) => { for (;;) { let n = Number(long()); if (n === 0) return; if (n < 0) { n = -n; long(); } for (let i = 0; i < n; i++) { item(); each(); } } };
  const read = (s) => {
    if (Array.isArray(s)) { const branch = s[long()]; if (branch === undefined) throw new Error("bad Avro union branch"); return read(branch); }
    if (typeof s === "string") {
      switch (s) {
        case "null": return null;
        case "boolean": need(1); return bytes[pos++] === 1;
        case "int": case "long": return long();
        case "float": need(4); pos += 4; return view.getFloat32(pos - 4, true);
        case "double": need(8); pos += 8; return view.getFloat64(pos - 8, true);
        case "bytes": return hex(blob());
        case "string": return new TextDecoder().decode(blob());
        default: if (named[s]) return read(named[s]); throw new Error(`unknown Avro type ${s}`);
      }
    }
    switch (s.type) {
      case "record": case "error": { const o = {}; for (const f of s.fields) o[f.name] = read(f.type); return o; }
      case "enum": return s.symbols[long()];
      case "array": { const out = []; blocks(() => out.push(read(s.items))); return out; }
      case "map": { const out = {}; blocks(() => { const k = new TextDecoder().decode(blob()); out[k] = read(s.values); }); return out; }
      case "fixed": { need(s.size); pos += s.size; return hex(bytes.subarray(pos - s.size, pos)); }
      default: return read(s.type);
    }
  };
  const value = read(schema);
  if (pos !== bytes.length) throw new Error("bytes left after the Avro value");
  return value;
}

function render(b, as) {
  if (b === null) return { kind: "null", text: "null" };
  if (as === "hex") return { kind: "hex", text: hex(b) };
  const id = framedId(b);
  if ((as === "auto" || as === "avro") && id !== null && schemas.get(id)) {
    const { type, schema } = schemas.get(id);
    try {
      const value = type === "AVRO" ? avroDecode(schema, b.subarray(5)) : JSON.parse(utf8.decode(b.subarray(5)));
      return { kind: `${type.toLowerCase()} (schema id ${id})`, text: JSON.stringify(value, null, 2) };
    } catch (e) {
      return { kind: `undecodable (schema id ${id})`, text: `${e.message}: ${hex(b.subarray(5))}` };
    }
  }
  if (as === "avro" && id !== null) return { kind: `schema id ${id}`, text: hex(b.subarray(5)) };
  let text;
  try { text = utf8.decode(b); } catch { return { kind: "hex", text: hex(b) }; }
  if (as === "text") return { kind: "text", text };
  try {
    const v = JSON.parse(text);
    return { kind: "json", text: JSON.stringify(v, null, 2) };
  } catch {
    return as === "json" ? { kind: "hex", text: hex(b) } : { kind: "text", text };
  }
}

// -- paged lists: the API's search, after and next, one shape for every list ------------------
const listPage = (route, q) => { location.hash = `${route}?${new URLSearchParams(q)}`; };

function searchForm(route, id, search, placeholder = "name contains") {
  const box = h("input", { id, value: search, placeholder });
  return h("form", { class: "row", onsubmit: (ev) => { ev.preventDefault(); listPage(route, { search: box.value }); } },
    h("label", {}, "Search", box), h("button", { type: "submit" }, "Search"));
}

function pager(route, { search, after, next, nextId }) {
  return h("div", { class: "row" },
    after ? h("button", { class: "plain", type: "button", onclick: () => listPage(route, { search }) }, "First page") : null,
    next ? h("button", { class: "plain", type: "button", id: nextId, onclick: () => listPage(route, { search, after: next }) }, "Next page") : null);
}

// -- topics -------------------------------------------------------------------------------------
async function topicsPage(params) {
  const seq = navSeq;
  const search = params.get("search") || "";
  const after = params.get("after") || "";
  const page = await get("/topics", { search, after, limit: PAGE_SIZE });
  const subjects = new Set(await get("/registry/subjects").catch(() => []));
  const details = await Promise.all(page.topics.map((t) => get(`/topics/${enc(t)}`).catch(() => null)));
  const series = await Promise.all(page.topics.map((t) => get(`/topics/${enc(t)}/throughput`, { commits: 50 }).catch(() => null)));
  const sparks = [];
  const rows = page.topics.map((name, i) => {
    const d = details[i];
    const parts = d ? d.partition_offsets || [] : [];
    const records = parts.reduce((s, p) => s + (p.high_watermark - p.log_start_offset), 0);
    const size = parts.reduce((s, p) => s + p.size_bytes, 0);
    const cfg = d ? d.config : {};
    return h(
      "tr",
      { "data-topic": name },
      h("td", {}, h("a", { href: `#/topic/${enc(name)}` }, name)),
      h("td", { class: "num" }, d ? d.partitions : "?"),
      h("td", { class: "num" }, d ? fmt.format(records) : "?"),
      h("td", { class: "num" }, d ? bytes(size) : "?"),
      h("td", {}, duration(cfg["retention.ms"] ?? 604800000)),
      h("td", {}, cfg["cleanup.policy"] || "delete"),
      h("td", {}, subjects.has(`${name}-value`) ? h("span", { class: "tag" }, `${name}-value`) : ""),
      h("td", { class: "spark" }, spark(series[i], sparks, name)),
      h("td", {}, h("a", { href: `#/messages/${enc(name)}` }, "messages")),
    );
  });
  show(
    seq,
    h("h1", {}, "Topics"),
    searchForm("#/topics", "topic-search", search),
    h(
      "table",
      { id: "topics" },
      h("thead", {}, h("tr", {}, ["Topic", "Partitions", "Records", "Size", "Retention", "Cleanup", "Value schema", "Produced (latest appends)", ""].map((c, i) => h("th", { class: i > 0 && i < 4 ? "num" : "" }, c)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 9, class: "muted" }, "No topics."))),
    ),
    pager("#/topics", { search, after, next: page.next, nextId: "next-page" }),
    createTopicForm(),
  );
  for (const [canvas, labels, data] of sparks) chart(canvas, "line", labels, [{ label: "records", data, pointRadius: 0, borderWidth: 1 }], { sparkline: true });
}

// A topic's records appended per time bucket, over its latest appends (its Delta history).
function spark(doc, sparks, name) {
  const commits = doc ? doc.commits : [];
  if (!commits.length) return h("span", { class: "muted" }, "none yet");
  const buckets = 20;
  const first = commits[0].at_ms;
  const last = Math.max(commits[commits.length - 1].at_ms, first + 1);
  const data = new Array(buckets).fill(0);
  for (const c of commits) data[Math.min(buckets - 1, Math.floor(((c.at_ms - first) / (last - first)) * buckets))] += c.records;
  const canvas = h("canvas", { id: `spark-${name}`, width: 120, height: 28 });
  sparks.push([canvas, data.map((_, i) => new Date(first + ((last - first) * i) / buckets).toLocaleTimeString()), data]);
  return h("div", { class: "sparkline", title: `${commits.reduce((s, c) => s + c.records, 0)} records in the latest ${commits.length} appends` }, canvas);
}

function createTopicForm() {
  const name = h("input", { id: "new-topic-name", required: true, placeholder: "orders" });
  const partitions = h("input", { id: "new-topic-partitions", type: "number", value: 1 });
  const schemaType = h("select", { id: "new-topic-schema-type" }, ["none", "AVRO", "JSON"].map((t) => h("option", { value: t }, t)));
  const schema = h("textarea", { id: "new-topic-schema", placeholder: "value schema (optional)" });
  const submit = guarded(async () => {
    const body = { name: name.value, partitions: Number(partitions.value) };
    if (schemaType.value !== "none") body.value_schema = { schemaType: schemaType.value, schema: schema.value };
    await api("POST", "/topics", { json: body });
    notice = `Created topic ${name.value}.`;
    location.hash = `#/topic/${enc(name.value)}`;
  });
  return h(
    "form",
    { class: "panel", id: "create-topic", onsubmit: (ev) => { ev.preventDefault(); submit(); } },
    h("h2", {}, "Create a topic"),
    h("div", { class: "row" }, h("label", {}, "Name", name), h("label", {}, "Partitions", partitions), h("label", {}, "Value schema", schemaType)),
    schema,
    h("div", { class: "row" }, h("button", { type: "submit" }, "Create")),
  );
}

async function topicPage(name) {
  const seq = navSeq;
  const d = await get(`/topics/${enc(name)}`);
  const parts = d.partition_offsets || [];
  // errors.tolerance=all sends invalid records to errors.deadletterqueue.topic.name, or <topic>.dlq
  const deadLetters = d.config["errors.tolerance"] === "all" ? d.config["errors.deadletterqueue.topic.name"] || `${name}.dlq` : null;
  const owners = {};
  for (const o of (await get("/cluster", { topic: name }).catch(() => ({}))).partitions || []) owners[o.partition] = o.owner;
  const canvas = h("canvas", { id: "partition-chart" });
  const key = h("input", { id: "config-key", placeholder: "retention.ms" });
  const value = h("input", { id: "config-value", placeholder: "value (empty: default)" });
  const more = h("input", { id: "partition-count", type: "number", value: d.partitions + 1 });
  const confirm = h("input", { id: "delete-confirm", placeholder: `type ${name} to confirm` });
  const alter = guarded(async () => {
    if (!key.value.trim()) throw new Error("Enter a config key to set, for example retention.ms (the table above lists them).");
    await api("PATCH", `/topics/${enc(name)}/config`, { json: { config: { [key.value]: value.value === "" ? null : value.value } } });
    await topicPage(name);
    say(`Set ${key.value}.`, true);
  });
  const grow = guarded(async () => {
    await api("POST", `/topics/${enc(name)}/partitions`, { json: { count: Number(more.value) } });
    await topicPage(name);
    say(`${name} has ${more.value} partitions.`, true);
  });
  const remove = guarded(async () => {
    if (confirm.value !== name) throw new Error(`Type the topic's name (${name}) to delete it.`);
    await api("DELETE", `/topics/${enc(name)}`);
    notice = `Deleted topic ${name}.`;
    location.hash = "#/topics";
  });
  show(
    seq,
    h("h1", {}, "Topic ", h("span", { id: "topic-name" }, name)),
    h("p", {}, h("a", { href: `#/messages/${enc(name)}` }, "Browse messages"),
      deadLetters ? [" · ", h("a", { href: `#/messages/${enc(deadLetters)}`, id: "dead-letters" }, "dead letters")] : ""),
    h("div", { class: "charts" }, h("div", { class: "chart" }, canvas)),
    h("h2", {}, "Partitions"),
    h("table", { id: "partitions" },
      h("thead", {}, h("tr", {}, ["Partition", "Log start", "High watermark", "Records", "Segments", "Size", "Owner gateway"].map((c, i) => h("th", { class: i < 6 ? "num" : "" }, c)))),
      h("tbody", {}, parts.map((p) => h("tr", {},
        h("td", { class: "num" }, p.partition), h("td", { class: "num" }, p.log_start_offset), h("td", { class: "num" }, p.high_watermark),
        h("td", { class: "num" }, p.high_watermark - p.log_start_offset), h("td", { class: "num" }, p.segments), h("td", { class: "num" }, bytes(p.size_bytes)),
        h("td", {}, owners[p.partition] || ""))))),
    h("h2", {}, "Configuration"),
    h("table", { id: "config" }, h("tbody", {}, Object.entries(d.config).sort().map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, v))))),
    h("form", { class: "row", onsubmit: (ev) => { ev.preventDefault(); alter(); } }, h("label", {}, "Config key", key), h("label", {}, "Value", value), h("button", { type: "submit", id: "set-config" }, "Set")),
    h("form", { class: "row", onsubmit: (ev) => { ev.preventDefault(); grow(); } }, h("label", {}, "Partitions", more), h("button", { type: "submit", id: "add-partitions" }, "Add partitions")),
    h("form", { class: "row", onsubmit: (ev) => { ev.preventDefault(); remove(); } }, h("label", {}, "Delete", confirm), h("button", { type: "submit", class: "danger", id: "delete-topic" }, "Delete topic")),
  );
  chart(canvas, "bar", parts.map((p) => `p${p.partition}`), [{ label: "records", data: parts.map((p) => p.high_watermark - p.log_start_offset) }]);
}

// -- messages ---------------------------------------------------------------------------------------
async function messagesPage(name, params) {
  const seq = navSeq;
  const d = await get(`/topics/${enc(name)}`);
  const partition = Number(params.get("p") || 0);
  const from = params.get("from") || "newest";
  const as = params.get("as") || "auto";
  // backward: the page of records before the start, newest first; forward: from the start on, oldest first
  const direction = params.get("dir") || (from === "newest" ? "backward" : "forward");
  const info = (d.partition_offsets || []).find((p) => p.partition === partition) || { log_start_offset: 0, high_watermark: 0 };
  let offset;
  if (from === "offset") {
    offset = Number(params.get("offset"));
    if (params.get("offset") === "" || !Number.isSafeInteger(offset) || offset < 0) throw new Error("Enter an offset to start from: a whole number, 0 or more.");
  } else if (from === "timestamp") {
    // the time box is UTC, as the timestamps below are shown
    const at = Date.parse(`${params.get("ts") || ""}Z`);
    if (!Number.isFinite(at)) throw new Error("Enter a time (UTC) to start from.");
    const found = await get(`/topics/${enc(name)}/offsets`, { at: Math.max(at, 0) });
    offset = (found.partitions.find((p) => p.partition === partition) || {}).offset ?? info.high_watermark;
  } else if (from === "earliest") offset = info.log_start_offset;
  else offset = info.high_watermark; // newest: the page before the high watermark
  offset = Math.min(Math.max(offset, info.log_start_offset), info.high_watermark);
  const fetchFrom = (at, count) => get(`/topics/${enc(name)}/partitions/${partition}/records`, { offset: at, max_records: count, key_format: "binary", value_format: "binary" });
  let records = [];
  if (direction === "forward") {
    if (offset < info.high_watermark) records = (await fetchFrom(offset, PAGE_SIZE)).records;
  } else {
    // the PAGE_SIZE records just before `offset`: read from PAGE_SIZE offsets earlier up to it (a
    // fetch stops at its byte limit, so large records take several), and keep the last ones; a
    // compacted partition has gaps, so a short page reaches further back, a few times at most
    let upTo = offset;
    for (let tries = 0; records.length < PAGE_SIZE && upTo > info.log_start_offset && tries < 8; tries++) {
      const lo = Math.max(info.log_start_offset, upTo - PAGE_SIZE);
      const got = [];
      for (let at = lo, reads = 0; at < upTo && reads < 50; reads++) {
        const page = await fetchFrom(at, upTo - at);
        got.push(...page.records.filter((r) => r.offset < upTo));
        if (!page.records.length || page.next_offset <= at) break;
        at = page.next_offset;
      }
      records = [...got, ...records];
      upTo = lo;
    }
    records = records.slice(-PAGE_SIZE);
  }
  await loadSchemas(records.flatMap((r) => [framedId(fromBase64(r.value)), framedId(fromBase64(r.key))]));
  const set = (q) => { const p = new URLSearchParams(params); for (const [k, v] of Object.entries(q)) p.set(k, v); location.hash = `#/messages/${enc(name)}?${p}`; };
  const first = records.length ? records[0].offset : offset;
  const last = records.length ? records[records.length - 1].offset : offset - 1;
  const partSel = h("select", { id: "msg-partition" }, Array.from({ length: d.partitions }, (_, i) => h("option", { value: i, selected: i === partition }, `partition ${i}`)));
  const fromSel = h("select", { id: "msg-from" }, ["newest", "earliest", "offset", "timestamp"].map((f) => h("option", { value: f, selected: f === from }, f)));
  // each start reads its natural way unless the user picks a direction after it
  fromSel.addEventListener("change", () => { dirSel.value = fromSel.value === "newest" ? "backward" : "forward"; });
  const offIn = h("input", { id: "msg-offset", type: "number", min: 0, value: params.get("offset") ?? info.log_start_offset });
  const tsIn = h("input", { id: "msg-ts", type: "datetime-local", step: 1, value: params.get("ts") || "" });
  const dirSel = h("select", { id: "msg-dir" }, [["forward", "forward (oldest first)"], ["backward", "backward (newest first)"]].map(([f, label]) => h("option", { value: f, selected: f === direction }, label)));
  const asSel = h("select", { id: "msg-as" }, ["auto", "json", "text", "avro", "hex"].map((f) => h("option", { value: f, selected: f === as }, f)));
  const find = h("input", { id: "msg-search", placeholder: "search this page" });
  const body = h("tbody");
  const draw = () => {
    const needle = find.value.toLowerCase();
    const shown = direction === "backward" ? [...records].reverse() : records;
    body.replaceChildren(...shown.map((r) => {
      const key = render(fromBase64(r.key), as);
      const value = render(fromBase64(r.value), as);
      const headers = Object.entries(r.headers || {}).map(([k, v]) => `${k}=${v === null ? "null" : v}`);
      const line = `${key.text} ${value.text} ${headers.join(" ")}`.toLowerCase();
      if (needle && !line.includes(needle)) return null;
      return h("tr", { class: "record", "data-offset": r.offset },
        h("td", { class: "num" }, r.offset),
        h("td", {}, when(r.timestamp), h("br"), h("span", { class: "tag" }, r.timestamp_type === 1 ? "LogAppendTime" : "CreateTime")),
        h("td", {}, key.kind !== "null" && key.kind !== "text" ? h("span", { class: "tag" }, key.kind) : "", h("pre", { class: "value" }, clip(key.text))),
        h("td", {}, h("span", { class: "tag" }, value.kind), h("pre", { class: "value" }, clip(value.text))),
        h("td", {}, headers.map((x) => h("div", { class: "header" }, x))));
    }).filter(Boolean));
  };
  find.addEventListener("input", draw);
  const follow = h("button", { type: "button", class: "plain", id: "msg-follow" }, "Follow live");
  follow.addEventListener("click", () => followLive(name, partition, records, draw, follow));
  // the pages before and after this one, whichever way it was read
  const older = h("button", { type: "button", class: "plain", id: "msg-older", disabled: first <= info.log_start_offset,
    onclick: () => set({ from: "offset", offset: first, dir: "backward" }) }, "Older");
  const newer = h("button", { type: "button", class: "plain", id: "msg-newer", disabled: last + 1 >= info.high_watermark,
    onclick: () => set({ from: "offset", offset: last + 1, dir: "forward" }) }, "Newer");
  show(
    seq,
    h("h1", {}, "Messages of ", h("a", { href: `#/topic/${enc(name)}` }, name)),
    h("form", { class: "row", onsubmit: (ev) => { ev.preventDefault(); set({ p: partSel.value, from: fromSel.value, offset: offIn.value, ts: tsIn.value, dir: dirSel.value, as: asSel.value }); } },
      h("label", {}, "Partition", partSel), h("label", {}, "From", fromSel), h("label", {}, "Offset", offIn), h("label", {}, "Time (UTC)", tsIn),
      h("label", {}, "Direction", dirSel), h("label", {}, "Show as", asSel), h("button", { type: "submit", id: "msg-go" }, "Browse")),
    h("div", { class: "row" }, older, newer, h("label", {}, "Find", find), follow,
      h("span", { class: "muted", id: "msg-position" }, records.length
        ? `offsets ${first} .. ${last} of ${info.log_start_offset} .. ${info.high_watermark - 1} · showing ${records.length}`
        : `offsets ${info.log_start_offset} .. ${info.high_watermark - 1} · no records here`)),
    h("table", { id: "messages" }, h("thead", {}, h("tr", {}, ["Offset", "Timestamp (UTC)", "Key", "Value", "Headers"].map((c) => h("th", {}, c)))), body),
    produceForm(name, partition),
  );
  draw();
}

// Server-sent events through fetch (an EventSource cannot send the Authorization header).
async function followLive(name, partition, records, draw, button) {
  let redraw = 0;
  if (streamAbort) { streamAbort.abort(); streamAbort = null; button.textContent = "Follow live"; return; }
  const mine = new AbortController();
  streamAbort = mine;
  button.textContent = "Stop following";
  const headers = { Accept: "text/event-stream" };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  try {
    const r = await fetch(`/topics/${enc(name)}/partitions/${partition}/stream?key_format=binary&value_format=binary`, { headers, signal: mine.signal });
    if (!r.ok) throw new ApiError(r.status, String(r.status), (await r.json()).error.message);
    const reader = r.body.getReader();
    const text = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        say("The server ended the live stream (it restarted, or the topic changed): press Follow live to go on.");
        break;
      }
      buf += text.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const kind = (event.match(/^event: (.*)$/m) || [])[1];
        const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        if (kind === "record" && data) {
          const record = JSON.parse(data);
          await loadSchemas([framedId(fromBase64(record.value)), framedId(fromBase64(record.key))]);
          records.push(record);
          if (records.length > 500) records.shift();
          if (!redraw) redraw = requestAnimationFrame(() => { redraw = 0; draw(); }); // once a frame, however many arrive
        }
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") say(e instanceof TypeError ? OFFLINE : e.message || String(e));
  }
  if (streamAbort === mine && !mine.signal.aborted) { streamAbort = null; button.textContent = "Follow live"; }
}

function produceForm(name, partition) {
  const key = h("input", { id: "produce-key", placeholder: "key (optional)" });
  const value = h("textarea", { id: "produce-value", placeholder: '{"hello": "world"}' });
  const valueAs = h("select", { id: "produce-as" }, [h("option", { value: "json" }, "JSON"), h("option", { value: "string" }, "text")]);
  const headers = h("input", { id: "produce-headers", placeholder: "headers: a=1, b=2" });
  const send = guarded(async () => {
    const hdrs = {};
    for (const part of headers.value.split(",").map((s) => s.trim()).filter(Boolean)) {
      const [k, ...v] = part.split("=");
      hdrs[k.trim()] = v.join("=").trim();
    }
    // The value goes to the API as typed: malformed JSON is the API's to refuse, with its message.
    const record = [`"partition":${partition}`];
    if (key.value) record.push(`"key":${JSON.stringify(key.value)}`);
    if (Object.keys(hdrs).length) record.push(`"headers":${JSON.stringify(hdrs)}`);
    record.push(`"value":${valueAs.value === "json" ? value.value : JSON.stringify(value.value)}`);
    const body = `{"value_format":${JSON.stringify(valueAs.value)},"records":[{${record.join(",")}}]}`;
    const { doc } = await api("POST", `/topics/${enc(name)}/records`, { body });
    say(`Produced at offset ${doc.offsets[0].offset} of partition ${doc.offsets[0].partition}.`, true);
  });
  return h("form", { class: "panel", id: "produce", onsubmit: (ev) => { ev.preventDefault(); send(); } },
    h("h2", {}, `Produce a test record to partition ${partition}`),
    h("div", { class: "row" }, h("label", {}, "Key", key), h("label", {}, "Value as", valueAs), h("label", {}, "Headers", headers)),
    value, h("div", { class: "row" }, h("button", { type: "submit", id: "produce-send" }, "Produce")));
}

// -- consumer groups -----------------------------------------------------------------------------------
async function groupsPage(params) {
  const seq = navSeq;
  const search = params.get("search") || "";
  const after = params.get("after") || "";
  const page = await get("/groups", { search, after, limit: PAGE_SIZE });
  show(
    seq,
    h("h1", {}, "Consumer groups"),
    searchForm("#/groups", "group-search", search),
    h("table", { id: "groups" },
      h("thead", {}, h("tr", {}, ["Group", "State", "Members", "Generation"].map((c, i) => h("th", { class: i > 1 ? "num" : "" }, c)))),
      h("tbody", {}, page.groups.length ? page.groups.map((g) => h("tr", { "data-group": g.group },
        h("td", {}, h("a", { href: `#/group/${enc(g.group)}` }, g.group)), h("td", {}, g.state),
        h("td", { class: "num" }, g.members), h("td", { class: "num" }, g.generation))) : h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No groups.")))),
    pager("#/groups", { search, after, next: page.next, nextId: "next-groups" }),
  );
}

const WINDOWS = { "15 min": 900000, "1 h": 3600000, "24 h": 86400000, "7 d": 604800000 };

async function groupPage(name, params) {
  const seq = navSeq;
  const g = await get(`/groups/${enc(name)}`);
  const windowName = params.get("window") || "1 h";
  const until = Date.now();
  const history = await get(`/groups/${enc(name)}/lag-history`, { since_ms: until - (WINDOWS[windowName] || 3600000), until_ms: until, points: 30 });
  const canvas = h("canvas", { id: "lag-chart" });
  // the topics it committed to or subscribes to; any other topic may be typed
  const topics = [...new Set([...g.lag.map((r) => r.topic), ...g.members.flatMap((m) => m.topics)])].sort();
  const topicSel = h("input", { id: "reset-topic", list: "reset-topics", value: topics[0] || "", placeholder: "topic" });
  const topicList = h("datalist", { id: "reset-topics" }, topics.map((t) => h("option", { value: t })));
  const toSel = h("select", { id: "reset-to" }, ["earliest", "latest", "timestamp", "offset"].map((t) => h("option", { value: t }, t)));
  const at = h("input", { id: "reset-value", placeholder: "epoch ms or offset" });
  const windowSel = h("select", { id: "lag-window", onchange: () => { location.hash = `#/group/${enc(name)}?window=${enc(windowSel.value)}`; } },
    Object.keys(WINDOWS).map((w) => h("option", { value: w, selected: w === windowName }, w)));
  const reset = guarded(async () => {
    if (!topicSel.value.trim()) throw new Error("Enter the topic whose offsets to reset.");
    const body = { topic: topicSel.value.trim(), to: toSel.value };
    if (toSel.value === "timestamp" || toSel.value === "offset") {
      const n = Number(at.value.trim());
      if (at.value.trim() === "" || !Number.isSafeInteger(n) || n < 0) {
        throw new Error(toSel.value === "offset" ? "Enter the offset to reset to: a whole number, 0 or more." : "Enter the time to reset to, in epoch milliseconds.");
      }
      body[toSel.value] = n;
    }
    const { doc } = await api("POST", `/groups/${enc(name)}/offsets/reset`, { json: body });
    await groupPage(name, params);
    say(`Reset ${doc.offsets.length} partition(s) of ${body.topic}.`, true);
  });
  show(
    seq,
    h("h1", {}, "Group ", h("span", { id: "group-name" }, name)),
    h("p", { id: "group-state" }, `State ${g.state} · generation ${g.generation} · protocol ${g.assignor || "-"} · ${g.members.length} member(s)`),
    h("h2", {}, "Lag over time ", windowSel),
    h("p", { class: "muted" }, "The lag of the partitions the group had committed at each moment (Delta time travel of the offsets table); gaps: no commit yet, or history no longer kept."),
    h("div", { class: "charts" }, h("div", { class: "chart" }, canvas)),
    h("h2", {}, "Members"),
    h("table", { id: "members" },
      h("thead", {}, h("tr", {}, ["Member", "Instance", "Client", "Subscribed", "Assigned"].map((c) => h("th", {}, c)))),
      h("tbody", {}, g.members.length ? g.members.map((m) => h("tr", {},
        h("td", {}, m.member_id), h("td", {}, m.instance_id || ""), h("td", { class: "client" }, [m.client_id, m.client_host].filter(Boolean).join(" @ ")),
        h("td", {}, m.topics.join(", ")),
        h("td", {}, Object.entries(m.assignment).map(([t, ps]) => `${t}: ${ps.join(", ")}`).join("; ")))) : h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No members.")))),
    h("h2", {}, "Committed offsets and lag"),
    h("table", { id: "lag" },
      h("thead", {}, h("tr", {}, ["Topic", "Partition", "Committed", "High watermark", "Lag"].map((c, i) => h("th", { class: i ? "num" : "" }, c)))),
      h("tbody", {}, g.lag.map((r) => h("tr", {}, h("td", {}, r.topic), h("td", { class: "num" }, r.partition),
        h("td", { class: "num" }, r.committed_offset ?? "none"), h("td", { class: "num" }, r.high_watermark),
        h("td", { class: "num", title: r.committed_offset === null ? "no commit yet: counted from the log start" : "" }, r.committed_offset === null ? `${r.lag} (from log start)` : r.lag))))),
    h("form", { class: "panel", id: "reset", onsubmit: (ev) => { ev.preventDefault(); reset(); } },
      h("h2", {}, "Reset offsets"),
      h("p", { class: "muted" }, "Only while the group has no members (the API refuses otherwise)."),
      topicList,
      h("div", { class: "row" }, h("label", {}, "Topic", topicSel), h("label", {}, "To", toSel), h("label", {}, "Timestamp or offset", at),
        h("button", { type: "submit", id: "reset-send" }, "Reset"))),
  );
  chart(canvas, "line", history.points.map((p) => new Date(p.at_ms).toLocaleTimeString()), [{ label: "total lag of committed partitions (records)", data: history.points.map((p) => p.lag), spanGaps: false }]);
}

// -- schemas -----------------------------------------------------------------------------------------
// Subjects follow Confluent's TopicNameStrategy: <topic>-value and <topic>-key.
const topicOf = (subject) => subject.replace(/-(value|key)$/, "");

async function schemasPage(params) {
  const seq = navSeq;
  const search = params.get("search") || "";
  const after = params.get("after") || "";
  const page = await get("/schemas", { search, after, limit: PAGE_SIZE }); // the server pages and filters
  show(
    seq,
    h("h1", {}, "Schemas"),
    searchForm("#/schemas", "subject-search", search),
    h("table", { id: "subjects" },
      h("thead", {}, h("tr", {}, ["Subject", "Latest version", "Type", "Id", "Compatibility", "Used by topic"].map((c) => h("th", {}, c)))),
      h("tbody", {}, page.subjects.length ? page.subjects.map((x) => h("tr", { "data-subject": x.subject },
        h("td", {}, h("a", { href: `#/schema/${enc(x.subject)}` }, x.subject)),
        h("td", {}, `${x.version}`), h("td", {}, x.schemaType), h("td", {}, `${x.id}`), h("td", {}, x.compatibility),
        h("td", {}, x.topic ? h("a", { href: `#/topic/${enc(x.topic)}` }, x.topic) : h("span", { class: "muted" }, "none")))) :
        h("tr", {}, h("td", { colspan: 6, class: "muted" }, search ? "No subjects match." : "No subjects yet: create a topic with a value schema, or register one.")))),
    pager("#/schemas", { search, after, next: page.next, nextId: "next-subjects" }),
  );
}

function pretty(schema) {
  try { return JSON.stringify(JSON.parse(schema), null, 2); } catch { return schema; }
}

// a line diff (longest common subsequence): [kind, line] with kind " " (both), "-" (left), "+" (right)
function diff(a, b) {
  const n = a.length, m = b.length;
  const L = Array.from({ length: n + 1 }, () => new Array(m + 1).fill(0));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) L[i][j] = a[i] === b[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  const out = [];
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (a[i] === b[j]) { out.push([" ", a[i]]); i++; j++; }
    else if (L[i + 1][j] >= L[i][j + 1]) out.push(["-", a[i++]]);
    else out.push(["+", b[j++]]);
  }
  while (i < n) out.push(["-", a[i++]]);
  while (j < m) out.push(["+", b[j++]]);
  return out;
}

async function schemaPage(subject, params) {
  const seq = navSeq;
  const versions = await get(`/registry/subjects/${enc(subject)}/versions`);
  const right = Number(params.get("right") || versions[versions.length - 1]);
  const left = Number(params.get("left") || versions[Math.max(versions.length - 2, 0)]);
  const [a, b] = await Promise.all([left, right].map((v) => get(`/registry/subjects/${enc(subject)}/versions/${v}`)));
  const level = await get(`/registry/config/${enc(subject)}`, { defaultToGlobal: true }).catch(() => null);
  const pick = (id, value) => h("select", { id, onchange: () => { location.hash = `#/schema/${enc(subject)}?left=${leftSel.value}&right=${rightSel.value}`; } },
    versions.map((v) => h("option", { value: v, selected: v === value }, `version ${v}`)));
  const leftSel = pick("left-version", left);
  const rightSel = pick("right-version", right);
  const lines = diff(pretty(a.schema).split("\n"), pretty(b.schema).split("\n"));
  const next = h("textarea", { id: "new-version" }, pretty(b.schema));
  const register = guarded(async () => {
    // as typed: the registry checks it against the subject's compatibility and answers why not
    const { doc } = await api("POST", `/registry/subjects/${enc(subject)}/versions`, { json: { schema: next.value, schemaType: b.schemaType || "AVRO" } });
    await schemaPage(subject, new URLSearchParams());
    say(`Registered schema id ${doc.id} under ${subject}.`, true);
  });
  show(
    seq,
    h("h1", {}, "Subject ", h("span", { id: "subject-name" }, subject)),
    h("p", {}, `${versions.length} version(s) · compatibility ${level ? level.compatibilityLevel : "?"} · `,
      h("a", { href: `#/topic/${enc(topicOf(subject))}` }, `topic ${topicOf(subject)}`)),
    h("div", { class: "row" }, h("label", {}, "Left", leftSel), h("label", {}, "Right", rightSel)),
    h("table", { id: "schema-diff" },
      h("thead", {}, h("tr", {}, h("th", {}, `version ${left} (id ${a.id})`), h("th", {}, `version ${right} (id ${b.id})`))),
      h("tbody", {}, lines.map(([kind, line]) => h("tr", { class: kind === " " ? "same" : kind === "-" ? "removed" : "added" },
        h("td", {}, h("pre", { class: "value" }, kind === "+" ? "" : line)),
        h("td", {}, h("pre", { class: "value" }, kind === "-" ? "" : line)))))),
    h("form", { class: "panel", id: "register", onsubmit: (ev) => { ev.preventDefault(); register(); } },
      h("h2", {}, "Register a new version"),
      h("p", { class: "muted" }, `Checked against ${level ? level.compatibilityLevel : "the subject's"} compatibility before it is kept.`),
      next, h("div", { class: "row" }, h("button", { type: "submit", id: "register-send" }, "Register"))),
  );
}

// -- jobs ----------------------------------------------------------------------------------------------
// what a run did: its figures in a line, the whole report a click away
function report(r) {
  const line = summary(r) || "nothing to do";
  return r && Object.keys(r).length ? h("details", {}, h("summary", {}, line), h("pre", { class: "value" }, JSON.stringify(r, null, 2))) : line;
}

function summary(report) {
  return Object.entries(report || {}).map(([k, v]) => `${k}: ${Array.isArray(v) ? v.length : typeof v === "object" && v !== null ? JSON.stringify(v) : v}`).join(" · ");
}

async function jobsPage() {
  const seq = navSeq;
  const doc = await get("/jobs");
  const runNow = (job, button) => guarded(async () => {
    button.disabled = true;
    button.textContent = "Running...";
    try {
      const { doc: line } = await api("POST", `/jobs/${enc(job)}/runs`, { json: {} });
      await jobsPage();
      if (line.ok) say(`${job} ran in ${line.seconds} s: ${summary(line.report) || "nothing to do"}.`, true);
      else say(`${job} failed: ${line.error}`);
    } finally {
      button.disabled = false;
    }
  })();
  show(
    seq,
    h("h1", {}, "Jobs"),
    h("p", { class: "muted" }, doc.scheduled ? "The scheduler runs these beside the gateway; the runs below are every gateway's, from _system/job_runs." : "The scheduler is off (jobs.schedule = false): runs happen only when asked."),
    ...doc.jobs.map((j) => {
      const button = h("button", { type: "button", id: `run-${j.job}` }, "Run now");
      button.addEventListener("click", () => runNow(j.job, button));
      return h("div", { class: "panel", "data-job": j.job },
        h("div", { class: "row" }, h("h2", {}, j.job), h("span", { class: "muted" }, `every ${duration(j.interval_s * 1000)}`), button),
        h("table", { class: "runs" },
          h("thead", {}, h("tr", {}, ["Started", "Seconds", "Result", "Trigger", "What it did"].map((c) => h("th", {}, c)))),
          h("tbody", {}, j.runs.length ? j.runs.map((r) => h("tr", { class: r.ok ? "ok" : "failed" },
            h("td", {}, new Date(r.started_at_ms).toLocaleString()), h("td", { class: "num" }, r.seconds),
            h("td", {}, r.ok ? "ok" : "failed"), h("td", {}, `${r.trigger} (${r.host} pid ${r.pid})`),
            h("td", {}, r.ok ? report(r.report) : r.error))) : h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No runs yet.")))));
    }),
    doc.jobs.some((j) => j.job === "replication") ? null
      : h("div", { class: "panel muted", id: "replication-off" }, "replication: not configured. Set jobs.replica_root (a second root) to copy every topic there (docs/OPERATIONS.md)."),
  );
}

// -- cluster ------------------------------------------------------------------------------------------
function metricTotals(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([-+0-9.eE]+|NaN|\+Inf)$/);
    if (m) out[m[1]] = (out[m[1]] || 0) + Number(m[3]);
  }
  return out;
}

async function clusterPage(params) {
  const seq = navSeq;
  const search = params.get("search") || "";
  const after = params.get("after") || "";
  const c = await get("/cluster");
  const leaders = await get("/cluster/partitions", { search, after, limit: PAGE_SIZE });
  const rateCanvas = h("canvas", { id: "produce-rate-chart" });
  const commitCanvas = h("canvas", { id: "commit-latency-chart" });
  const fetchCanvas = h("canvas", { id: "fetch-rate-chart" });
  const gateways = c.gateways || [];
  const yesNo = (v, yes, no) => (v === undefined || v === null ? "unknown" : v ? yes : no);
  show(
    seq,
    h("h1", {}, "Cluster"),
    h("table", { id: "gateways" },
      h("thead", {}, h("tr", {}, ["Gateway", "HTTP", "Kafka (node id)", "Health", "TLS", "Auth", "Partitions led (this page)", "Groups coordinated"].map((x) => h("th", {}, x)))),
      h("tbody", {}, gateways.map((g) => h("tr", { "data-gateway": g.gateway_id },
        h("td", {}, g.gateway_id, " ", g.gateway_id === c.self ? h("span", { class: "tag" }, "this gateway") : ""),
        h("td", {}, g.url || ""),
        h("td", {}, g.kafka ? `${g.kafka} (${g.node_id})` : "off"),
        h("td", {}, `${g.live ? "live" : "gone"}, heartbeat ${(g.heartbeat_age_ms / 1000).toFixed(1)} s ago`),
        h("td", { class: "tls" }, yesNo(g.tls, "TLS", "no TLS")),
        h("td", { class: "auth" }, yesNo(g.auth, "API keys", "no keys")),
        h("td", { class: "num" }, leaders.gateways[g.gateway_id] || 0),
        h("td", {}, (g.groups || []).join(", "), g.groups_total > (g.groups || []).length ? h("span", { class: "muted" }, ` and ${g.groups_total - g.groups.length} more`) : ""))))),
    h("h2", {}, "Partition leaders"),
    h("p", { class: "muted" }, "The gateway that appends to each partition (Kafka: its leader); producers' requests are forwarded to it."),
    searchForm("#/cluster", "leader-search", search, "topic name contains"),
    h("table", { id: "leaders" },
      h("thead", {}, h("tr", {}, ["Topic", "Partitions", ...gateways.map((g) => g.gateway_id)].map((x, i) => h("th", { class: i ? "num" : "" }, x)))),
      h("tbody", {}, leaders.topics.length ? leaders.topics.map((t) => h("tr", { "data-topic": t.topic },
        h("td", {}, h("a", { href: `#/topic/${enc(t.topic)}` }, t.topic)), h("td", { class: "num" }, t.partitions),
        ...gateways.map((g) => h("td", { class: "num", title: `partitions ${t.owners.map((o, p) => (o === g.gateway_id ? p : null)).filter((p) => p !== null).join(", ")}` },
          t.owners.filter((o) => o === g.gateway_id).length)))) : h("tr", {}, h("td", { colspan: 2 + gateways.length, class: "muted" }, "No topics.")))),
    pager("#/cluster", { search, after, next: leaders.next, nextId: "next-leaders" }),
    h("h2", {}, "This gateway, live"),
    h("div", { class: "charts" }, h("div", { class: "chart" }, rateCanvas), h("div", { class: "chart" }, commitCanvas), h("div", { class: "chart" }, fetchCanvas)),
  );
  const rate = chart(rateCanvas, "line", [], [{ label: "records produced / s", data: [] }]);
  const commit = chart(commitCanvas, "line", [], [{ label: "mean commit latency, ms", data: [] }]);
  const fetches = chart(fetchCanvas, "line", [], [{ label: "records fetched / s (HTTP and Kafka)", data: [] }]);
  let last = null;
  const sample = async () => {
    const r = await fetch("/metrics", { headers: sessionStorage.getItem(KEY) ? { Authorization: `Bearer ${sessionStorage.getItem(KEY)}` } : {} });
    if (!r.ok) return;
    const m = metricTotals(await r.text());
    const now = Date.now();
    if (last) {
      const dt = (now - last.at) / 1000;
      const label = new Date(now).toLocaleTimeString();
      const commits = (m.topiclake_commit_latency_seconds_count || 0) - (last.m.topiclake_commit_latency_seconds_count || 0);
      const secs = (m.topiclake_commit_latency_seconds_sum || 0) - (last.m.topiclake_commit_latency_seconds_sum || 0);
      push(rate, label, ((m.topiclake_records_in_total || 0) - (last.m.topiclake_records_in_total || 0)) / dt);
      push(commit, label, commits > 0 ? (secs / commits) * 1000 : 0);
      push(fetches, label, ((m.topiclake_records_out_total || 0) - (last.m.topiclake_records_out_total || 0)) / dt);
    }
    last = { at: now, m };
  };
  await sample();
  if (seq !== navSeq) return; // left meanwhile: no poller
  timers.push(setInterval(() => sample().catch(() => {}), 2000));
}

// -- charts (Chart.js, built by make setup) ---------------------------------------------------------
function chart(canvas, type, labels, datasets, { sparkline = false } = {}) {
  if (!window.Chart) {
    canvas.replaceWith(h("p", { class: "muted" }, "The chart library is missing: run make run or make setup (they fetch Chart.js with npm), then reload."));
    return null;
  }
  const c = new window.Chart(canvas, {
    type,
    data: { labels, datasets },
    options: sparkline
      ? { animation: false, responsive: false, events: [], plugins: { legend: { display: false }, tooltip: { enabled: false } }, scales: { x: { display: false }, y: { display: false, beginAtZero: true } } }
      : { animation: false, responsive: true, maintainAspectRatio: false, plugins: { legend: { display: true } } },
  });
  charts.push(c);
  return c;
}

function push(c, label, value) {
  if (!c) return;
  c.data.labels.push(label);
  c.data.datasets[0].data.push(value);
  if (c.data.labels.length > 60) { c.data.labels.shift(); c.data.datasets[0].data.shift(); }
  c.update();
}

// -- routing ------------------------------------------------------------------------------------------
const ROUTES = [
  [/^#\/topics$/, (m, q) => topicsPage(q), "topics"],
  [/^#\/topic\/([^?]+)$/, (m) => topicPage(decodeURIComponent(m[1])), "topics"],
  [/^#\/messages\/([^?]+)$/, (m, q) => messagesPage(decodeURIComponent(m[1]), q), "topics"],
  [/^#\/groups$/, (m, q) => groupsPage(q), "groups"],
  [/^#\/group\/([^?]+)$/, (m, q) => groupPage(decodeURIComponent(m[1]), q), "groups"],
  [/^#\/schemas$/, (m, q) => schemasPage(q), "schemas"],
  [/^#\/schema\/([^?]+)$/, (m, q) => schemaPage(decodeURIComponent(m[1]), q), "schemas"],
  [/^#\/jobs$/, () => jobsPage(), "jobs"],
  [/^#\/cluster$/, (m, q) => clusterPage(q), "cluster"],
];

async function route() {
  navSeq += 1;
  for (const t of timers) clearInterval(t);
  timers = [];
  if (streamAbort) { streamAbort.abort(); streamAbort = null; }
  const [path, query] = (location.hash || "#/topics").split("?");
  const params = new URLSearchParams(query || "");
  const key = sessionStorage.getItem(KEY);
  document.getElementById("logout").hidden = !key;
  document.getElementById("who").textContent = key ? "logged in with a key" : "";
  for (const [re, page, nav] of ROUTES) {
    const m = path.match(re);
    if (!m) continue;
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === nav);
    await guarded(page)(m, params);
    if (notice) { say(notice, true); notice = null; }
    document.body.dataset.ready = location.hash;
    return;
  }
  location.hash = "#/topics";
}

window.addEventListener("hashchange", route);
window.addEventListener("load", route);
