// The auditor's page: sign in, sessions, and one session's tree, timeline, prompts, context,
// compactions and quarantined events; the tenant's erasures, and an erased session's tombstones.
// Everything comes from the /v1 JSON API.

import { ApiError, allPages, everyItem, get, getLines, key, seg } from "./api.js";
import { $, clear, el, json, pager, time } from "./dom.js";
import { erasedNote, erasureCells, erasureFromEvent } from "./erasures.js";
import { messageView, overlayView } from "./messages.js";
import { applyOverlays, buildTree, latestLeafUnder, leaves, pageOf, pathTo, promptAt, what, who } from "./tree.js";

const PATH_PAGE = 100; // messages (or overlays) shown at once: a 1,000-message session stays light
const EVENTS_PAGE = 100;
const ASOF_SHOWN = 50;
const ERASURES_PAGE = 50; // erasures listed at once (the API's default page); "More erasures" adds the next

let S = null; // the open session: {sid, session, erased, tree, overlays, prompts, leaf, page, events, eventsPage, tab, asOf}
let sessionsCursor = null;
let loadedSessions = [];
let asOfTicket = 0;
let erasures = null; // the erasures loaded so far (null: not asked for yet), newest first
let erasuresCursor = null;
let erasuresTicket = 0; // a page that comes back after a sign-out or a newer reload is dropped

function plural(n, one, many = `${one}s`) {
  return `${n} ${n === 1 ? one : many}`;
}

function problem(e) {
  return e instanceof ApiError ? `${e.status} ${e.code || ""}: ${e.message}` : String(e);
}

/** A list read by ``everyItem``, whole or as far as it got: ``{items, error}``, ``error`` null when
 * every page came, else the failure, and ``items`` what the pages before it held. */
function listed(reading) {
  return reading.then((items) => ({ items, error: null }), (e) => ({ items: e?.loaded ?? [], error: e }));
}

/** ``n`` of a list, and whether some of it could not be loaded. */
function counted(list, one, many) {
  return `${plural(list.items.length, one, many)}${list.error ? " (not all loaded)" : ""}`;
}

/** What a panel shows of a list that did not load whole (null when it did): the failure, after
 * the items that came. */
function loadFailed(testid, what, list) {
  if (!list.error) return null;
  const text = list.items.length ? `… and loading more failed: ${problem(list.error)}` : `Could not load the ${what}: ${problem(list.error)}`;
  return el("p", { class: "error", "data-testid": testid }, text);
}

// -- sign in -------------------------------------------------------------------------------

async function signIn(candidate) {
  key.set(candidate);
  try {
    await get("/v1/sessions", { limit: 1 });
  } catch (e) {
    key.clear();
    throw e;
  }
}

async function showApp(signedIn) {
  $("signin").hidden = signedIn;
  $("app").hidden = !signedIn;
  $("who").hidden = !signedIn;
  if (signedIn) {
    // GET /v1/whoami answers read-only keys too (an auditor's; GET /v1/nats refuses them)
    const me = await get("/v1/whoami").catch(() => null);
    $("tenant-note").textContent = me ? `tenant ${me.tenant}${me.read_only ? " (read-only key)" : ""}` : "signed in";
  }
}

// -- sessions --------------------------------------------------------------------------------

function sessionItem(s, extra) {
  return el(
    "li",
    { class: S && S.sid === s.id ? "current" : "", "data-testid": "session-item", "data-sid": s.id },
    el(
      "button",
      { type: "button", class: "session-link", onclick: () => openSession(s.id) },
      el("b", {}, s.name || s.id),
      el("span", { class: "note" }, s.name ? ` ${s.id}` : ""),
      el("br"),
      el("span", { class: "note" }, s.created_at ? `${time(s.created_at)} · seq ${s.seq}` : ""),
      extra ? el("span", { class: "snippet" }, extra) : null,
    ),
  );
}

function renderSessions() {
  const q = $("session-filter").value.trim().toLowerCase();
  const shown = loadedSessions.filter((s) => !q || s.id.toLowerCase().includes(q) || (s.name || "").toLowerCase().includes(q));
  clear($("session-list"), shown.map((s) => sessionItem(s)));
  $("search-note").textContent = q ? `${shown.length} of ${loadedSessions.length} loaded sessions match; Enter searches messages` : "";
  $("more-sessions").hidden = sessionsCursor === null;
}

async function loadSessions(more) {
  const page = await get("/v1/sessions", { limit: 100, cursor: more ? sessionsCursor : undefined });
  loadedSessions = more ? loadedSessions.concat(page.sessions) : page.sessions;
  sessionsCursor = page.next_cursor;
  renderSessions();
}

async function searchMessages(q) {
  const { results } = await get("/v1/search", { q, limit: 200 });
  const bySession = new Map();
  for (const r of results) if (!bySession.has(r.session_id)) bySession.set(r.session_id, r);
  $("search-note").textContent = `${results.length} messages match "${q}" in ${bySession.size} sessions`;
  const known = new Map(loadedSessions.map((s) => [s.id, s]));
  clear(
    $("session-list"),
    [...bySession.values()].map((r) => sessionItem(known.get(r.session_id) || { id: r.session_id }, r.snippet)),
  );
  $("more-sessions").hidden = true;
}

// -- a session -----------------------------------------------------------------------------

/** Show the session pane or the erasures list in the main area. */
function showMain(view) {
  $("session").hidden = view !== "session";
  $("erasures-view").hidden = view !== "erasures";
  $("show-erasures").setAttribute("aria-pressed", String(view === "erasures"));
}

async function openSession(sid) {
  asOfTicket += 1;
  showMain("session");
  const base = `/v1/sessions/${seg(sid)}`;
  $("pick-note").hidden = true;
  $("session-body").hidden = false;
  $("session-error").textContent = "";
  try {
    const session = await get(base);
    const { items: nodes, last } = await allPages(`${base}/tree`, { limit: 1000 }, (p) => p.messages, (p) => p.next_cursor);
    const [overlays, prompts] = await Promise.all([
      listed(everyItem(`${base}/compactions`, "compactions")),
      listed(everyItem(`${base}/prompts`, "prompts")),
    ]);
    S = { sid, base, session, erased: null, tree: buildTree(nodes), overlays: overlays.items, prompts: prompts.items, lists: { overlays, prompts }, leaf: last.leaf_id, page: 1, events: null, eventsPage: null, tab: S && !S.erased ? S.tab : "messages", asOf: null };
  } catch (e) {
    const erasure = e instanceof ApiError && e.status === 410 ? await erasureInLog(sid).catch(() => null) : null;
    if (erasure) {
      await openErased(erasure);
      return;
    }
    $("session-error").textContent = problem(e);
    return;
  }
  $("session-erased").hidden = true;
  enableTabs();
  $("session-title").textContent = S.session.name || S.sid;
  $("session-meta").textContent = `id ${S.sid} · created ${time(S.session.created_at)} · last seq ${S.session.seq} · ${plural(S.tree.byId.size, "message")}, ${plural(leaves(S.tree).length, "branch", "branches")}, ${counted(S.lists.overlays, "overlay")}, ${counted(S.lists.prompts, "prompt version")}`;
  renderSessions();
  renderMessages();
  await showTab(S.tab);
}

// -- an erased session ----------------------------------------------------------------------

/** The erasure of a session whose reads answer 410 session_erased, or null when its log has
 * nothing of it (its erasure not published yet): its log tells. Its newest event is its session.erased event (who, why), or, when
 * something was published after that, a tombstone: then the erasures list has its record. */
async function erasureInLog(sid) {
  const base = `/v1/sessions/${seg(sid)}`;
  const { seq } = await get(`${base}/last-seq`);
  if (!seq) return null;
  const [line] = await getLines(`${base}/events`, { from_seq: seq, to_seq: seq, limit: 1 });
  if (!line) return null;
  return erasureFromEvent(sid, line) || (line.erased ? findErasure(sid) : null);
}

async function findErasure(sid) {
  let cursor;
  for (;;) {
    const page = await get("/v1/erasures", { limit: 500, cursor });
    const found = page.erasures.find((x) => x.session_id === sid);
    if (found) return found;
    if (page.next_cursor === null) return { session_id: sid, erased_at: null, requested_by: null, reason: null, seq: null };
    cursor = page.next_cursor;
  }
}

/** An erased session: its reads answer 410, but its log remains, each event a tombstone but its
 * session.erased event, so the timeline is what it shows, at that event when it was published. */
async function openErased(erasure) {
  asOfTicket += 1;
  showMain("session");
  const sid = erasure.session_id;
  const seq = Number.isInteger(erasure.seq) ? erasure.seq : null;
  S = { sid, base: `/v1/sessions/${seg(sid)}`, session: null, erased: erasure, tree: buildTree([]), overlays: [], prompts: [], lists: null, leaf: null, page: 1, events: null, eventsPage: null, tab: "timeline", asOf: seq };
  $("pick-note").hidden = true;
  $("session-body").hidden = false;
  $("session-error").textContent = "";
  $("session-title").textContent = sid;
  $("session-meta").textContent = `id ${sid} · erased${seq === null ? "" : ` · its session.erased event is seq ${seq}`}`;
  clear($("session-erased"), erasedNote(erasure));
  $("session-erased").hidden = false;
  enableTabs();
  renderSessions();
  await showTab("timeline");
}

/** Every tab, but only the timeline for an erased session (nothing else of it can be read). */
function enableTabs() {
  for (const b of document.querySelectorAll("[data-tab]")) b.disabled = Boolean(S.erased) && b.dataset.tab !== "timeline";
}

// -- tabs --------------------------------------------------------------------------------------

async function showTab(tab) {
  S.tab = tab;
  for (const b of document.querySelectorAll("[data-tab]")) b.setAttribute("aria-selected", String(b.dataset.tab === tab));
  for (const p of document.querySelectorAll("[data-panel]")) p.hidden = p.dataset.panel !== tab;
  try {
    if (tab === "timeline") await renderTimeline();
    if (tab === "prompts") renderPrompts();
    if (tab === "context") await renderContext();
    if (tab === "compactions") await renderCompactions();
    if (tab === "quarantine") await renderQuarantine();
  } catch (e) {
    $("session-error").textContent = problem(e);
  }
}

// -- messages: branches and the path ------------------------------------------------------

function renderBranches() {
  const all = leaves(S.tree);
  const onPath = new Set(S.leaf ? pathTo(S.tree, S.leaf) : []);
  clear(
    $("branches"),
    el("b", {}, `${plural(all.length, "branch", "branches")}: `),
    all.map((n, i) =>
      el(
        "button",
        {
          type: "button",
          class: onPath.has(n.id) ? "branch current" : "branch",
          "data-testid": "branch",
          "data-leaf": n.id,
          "aria-pressed": String(onPath.has(n.id)),
          onclick: () => selectLeaf(n.id),
        },
        `${n.id}`,
        el("span", { class: "note" }, ` ${pathTo(S.tree, n.id).length} msgs${i === 0 ? " · latest" : ""}`),
      ),
    ),
  );
}

function selectLeaf(leafId, page) {
  S.leaf = leafId;
  S.page = page || 1;
  renderMessages();
}

function siblingSwitch(node) {
  const siblings = S.tree.children.get(node.parent_id && S.tree.byId.has(node.parent_id) ? node.parent_id : null) || [];
  if (siblings.length < 2) return null;
  const i = siblings.findIndex((s) => s.id === node.id);
  const go = (j) => selectLeaf(latestLeafUnder(S.tree, siblings[j].id));
  return el(
    "span",
    { class: "switch", "data-testid": "branch-switch" },
    el("button", { type: "button", disabled: i === 0, "data-testid": "branch-prev", onclick: () => go(i - 1) }, "‹"),
    ` branch ${i + 1}/${siblings.length} `,
    el("button", { type: "button", disabled: i === siblings.length - 1, "data-testid": "branch-next", onclick: () => go(i + 1) }, "›"),
  );
}

async function showOriginal(node, card) {
  const pre = el("pre", { class: "original", "data-testid": "original" }, "loading the original…");
  card.append(pre);
  try {
    pre.textContent = json(await get(`${S.base}/messages/${seg(node.id)}`, { original: true }));
  } catch (e) {
    pre.textContent = problem(e);
  }
}

function card(id, withSwitch) {
  const node = S.tree.byId.get(id);
  return messageView(node, {
    prompt: promptAt(S.prompts, node.seq),
    onOriginal: showOriginal,
    extra: withSwitch ? siblingSwitch(node) : null,
  });
}

function renderMessages() {
  renderBranches();
  const ids = S.leaf ? pathTo(S.tree, S.leaf) : [];
  const items = applyOverlays(ids, S.overlays);
  const view = pageOf(items, S.page, PATH_PAGE);
  S.page = view.page;
  pager($("path-pager"), view, PATH_PAGE, items.length, (p) => selectLeaf(S.leaf, p), "path");
  clear(
    $("path"),
    items.length ? null : el("li", { class: "note" }, "No messages."),
    view.items.map((item) =>
      item.overlay ? overlayView(item.overlay, item.covered, (id) => card(id, true)) : card(item.id, true),
    ),
  );
}

// -- timeline and "as of" ---------------------------------------------------------------

async function loadEvents() {
  if (S.events) return;
  const events = [];
  let from = 1;
  for (;;) {
    const page = await getLines(`${S.base}/events`, { from_seq: from, limit: 1000 });
    events.push(...page);
    if (page.length < 1000) break;
    from = page[page.length - 1].seq + 1;
  }
  S.events = events;
}

// a line is an event, a refusal, or an erased session's tombstone (its envelope and size only):
// [type, the publisher's occurred_at (ISO, or null), who, what]
function eventCells(e) {
  const ev = e.event;
  if (ev) return [ev.type, ev.occurred_at, who(ev), what(ev)];
  if (e.refused) return [`refused: ${e.refused.reason}`, null, "", e.refused.detail];
  const gone = e.erased || {};
  const type = typeof gone.type === "string" ? gone.type : "event";
  return [`erased: ${type}`, gone.occurred_at, "", "erased (tombstone)"];
}

const SKEW_MS = 60_000; // a publisher's occurred_at further than this from stored_at is shown beside it

/** When the log stored the event (``stored_at``: the stream's clock, which no publisher sets),
 * with the publisher's own ``occurred_at`` beside it when the two are more than a minute apart:
 * a tenant publishing straight to the stream writes any time there, and an auditor reads the
 * log's. */
function timeCell(line, occurred) {
  const stored = Date.parse(line.stored_at);
  const claimed = typeof occurred === "string" ? Date.parse(occurred) : NaN;
  const skewed = !Number.isNaN(stored) && !Number.isNaN(claimed) && Math.abs(claimed - stored) > SKEW_MS;
  return el(
    "td",
    {
      "data-testid": "event-time",
      title: `stored by the log at ${line.stored_at ?? "an unknown time"}${typeof occurred === "string" ? `; the publisher's occurred_at: ${occurred}` : ""}`,
    },
    time(line.stored_at),
    skewed ? el("span", { class: "skew", "data-testid": "event-occurred" }, ` publisher says ${time(occurred)}`) : null,
  );
}

function eventRow(e) {
  const [type, occurred, by, about] = eventCells(e);
  const kind = e.event ? "" : e.refused ? "refused" : "erased";
  return el(
    "tr",
    {
      "data-testid": "event",
      "data-seq": e.seq,
      class: [S.asOf !== null && e.seq > S.asOf ? "after" : "", S.asOf === e.seq ? "current" : "", kind].join(" "),
      onclick: () => setAsOf(e.seq),
    },
    el("td", {}, String(e.seq)),
    el("td", {}, type),
    timeCell(e, occurred),
    el("td", {}, by),
    el("td", {}, about),
  );
}

function renderEvents() {
  const view = pageOf(S.events, S.eventsPage, EVENTS_PAGE);
  S.eventsPage = view.page;
  pager($("events-pager"), view, EVENTS_PAGE, S.events.length, (p) => { S.eventsPage = p; renderEvents(); }, "events");
  clear($("events-body"), view.items.map(eventRow));
}

async function renderTimeline() {
  await loadEvents();
  const slider = $("asof-slider");
  slider.max = String(Math.max(0, S.events.length - 1));
  if (S.asOf === null && S.events.length) S.asOf = S.events[S.events.length - 1].seq; // now
  if (S.eventsPage === null) S.eventsPage = Math.floor(Math.max(0, indexAtOrBefore(S.asOf ?? 0)) / EVENTS_PAGE) + 1;
  renderEvents();
  await showAsOf();
}

function setAsOf(seq) {
  S.asOf = seq;
  const i = indexAtOrBefore(seq);
  if (i >= 0) S.eventsPage = Math.floor(i / EVENTS_PAGE) + 1;
  renderEvents();
  showAsOf();
}

function indexAtOrBefore(seq) {
  let found = -1;
  S.events.forEach((e, i) => { if (e.seq <= seq) found = i; });
  return found;
}

async function showAsOf() {
  const seq = S.asOf ?? 0;
  const i = indexAtOrBefore(seq);
  $("asof-slider").value = String(Math.max(0, i));
  $("asof-seq").value = String(seq);
  const ev = i >= 0 ? S.events[i].event : null;
  $("asof-note").textContent = i >= 0 ? `event ${i + 1} of ${S.events.length}${ev ? ` · ${ev.type}` : ""} · stored ${time(S.events[i].stored_at)}` : "before the first event";
  $("asof-event").textContent = i >= 0 ? json(S.events[i]) : "";
  if (S.erased) {
    showErasedAsOf(seq);
    return;
  }
  const ticket = ++asOfTicket;
  const sid = S.sid;
  $("asof").setAttribute("aria-busy", "true");
  const [history, context, prompt] = await Promise.all([
    get(`${S.base}/history`, { as_of_seq: seq }).catch((e) => ({ error: e })),
    get(`${S.base}/context`, { as_of_seq: seq }).catch((e) => ({ error: e })),
    get(`${S.base}/system-prompt`, { as_of_seq: seq }).catch((e) => ({ error: e })),
  ]);
  if (ticket !== asOfTicket || !S || S.sid !== sid) return; // a newer position was asked for meanwhile
  if (history.error) {
    $("asof-history-note").textContent = problem(history.error);
    clear($("asof-history"));
  } else {
    const msgs = history.messages;
    const shown = msgs.slice(-ASOF_SHOWN);
    $("asof-history-note").textContent = `${msgs.length} messages on the latest branch${msgs.length > shown.length ? `, the last ${shown.length} shown` : ""}`;
    clear($("asof-history"), shown.map(briefMessage));
  }
  renderBlocks($("asof-context"), context);
  $("asof-prompt").textContent = prompt.error ? problem(prompt.error) : prompt.prompt === null ? "(no prompt recorded yet)" : `v${prompt.version} (seq ${prompt.seq}, ${prompt.tokens} tokens)\n\n${prompt.prompt}`;
  $("asof").setAttribute("aria-busy", "false");
  $("asof").dataset.seq = String(seq);
}

function showErasedAsOf(seq) {
  asOfTicket += 1; // a live session's answers still on their way are not drawn here
  $("asof-history-note").textContent = "erased: no message of it can be read";
  clear($("asof-history"));
  clear($("asof-context"), el("p", { class: "note" }, "Erased: no context block of it can be read."));
  $("asof-prompt").textContent = "(erased)";
  $("asof").setAttribute("aria-busy", "false");
  $("asof").dataset.seq = String(seq);
}

function briefMessage(m) {
  const parts = Array.isArray(m.parts) ? m.parts : [];
  const text = parts.map((p) => (p.type === "text" ? p.text : p.type)).join(" · ");
  const isSummary = String(m.id).startsWith("compaction_");
  return el("li", { class: isSummary ? "brief summary-brief" : "brief", "data-testid": "asof-message", "data-id": m.id }, el("span", { class: "role" }, isSummary ? "summary" : m.role), " ", text.length > 200 ? `${text.slice(0, 200)}…` : text);
}

// -- prompts, context, compactions, quarantine --------------------------------------------

function renderPrompts() {
  const nodes = [...S.tree.byId.values()];
  clear(
    $("prompts"),
    S.prompts.length || S.lists.prompts.error ? null : el("p", { class: "note" }, "No system prompt recorded for this session."),
    S.prompts.map((p, i) => {
      const next = S.prompts[i + 1];
      const turns = nodes.filter((n) => n.seq > p.seq && (!next || n.seq < next.seq));
      return el(
        "section",
        { class: "prompt-version", "data-testid": "prompt-version", "data-version": p.version },
        el("h3", {}, `Version ${p.version}`, el("span", { class: "note" }, ` · ${p.reason} · seq ${p.seq} · ${p.tokens} tokens`)),
        el(
          "p",
          { "data-testid": "prompt-turns" },
          turns.length ? `In force for ${plural(turns.length, "turn")}: ` : "In force for no turns yet.",
          turns.slice(0, 30).map((n) => el("code", { class: "turn" }, `${n.role}:${n.id} `)),
          turns.length > 30 ? `… and ${turns.length - 30} more` : "",
        ),
        el("pre", { class: "prompt" }, p.text),
      );
    }),
    loadFailed("prompts-error", "system prompts", S.lists.prompts),
  );
}

function renderBlocks(container, answer) {
  if (answer.error) {
    clear(container, el("p", { class: "error" }, problem(answer.error)));
    return;
  }
  clear(
    container,
    answer.blocks.length ? null : el("p", { class: "note" }, "No context blocks."),
    answer.blocks.map((b) => {
      const pct = b.max_tokens ? Math.min(100, Math.round((100 * b.tokens) / b.max_tokens)) : null;
      return el(
        "section",
        { class: "block", "data-testid": "block", "data-label": b.label },
        el("h4", {}, b.label, el("span", { class: "note" }, ` ${b.kind}${b.writable && b.kind !== "writable" ? " · writable" : ""}${b.description ? ` · ${b.description}` : ""}`)),
        el(
          "div",
          { class: "budget", "data-testid": "budget" },
          b.max_tokens ? el("meter", { min: 0, max: b.max_tokens, value: b.tokens, high: b.max_tokens * 0.9 }) : null,
          ` ${b.tokens}${b.max_tokens ? ` / ${b.max_tokens} tokens (${pct}%)` : " tokens"}`,
        ),
        el("pre", { class: "block-content" }, b.content),
      );
    }),
  );
}

async function renderContext() {
  renderBlocks($("context"), await get(`${S.base}/context`).catch((e) => ({ error: e })));
}

/** A table of ``rows`` (arrays of cells: text or nodes); ``empty``: the note shown for none,
 * ``rowAttrs(i)``: the attributes of row ``i``. */
function table(testid, headers, rows, { empty = "None.", rowAttrs = () => ({}) } = {}) {
  if (!rows.length) return el("p", { class: "note", "data-testid": testid }, empty);
  return el(
    "table",
    { class: "grid", "data-testid": testid },
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((r, i) => el("tr", rowAttrs(i), r.map((c) => el("td", {}, c))))),
  );
}

async function renderCompactions() {
  const failures = await listed(everyItem(`${S.base}/compaction-failures`, "failures"));
  const overlays = S.lists.overlays;
  clear(
    $("overlays"),
    overlays.error && !overlays.items.length ? null : table(
      "overlay-table",
      ["seq", "range", "leaf", "tokens", "summarizer", "recorded", "summary"],
      S.overlays.map((o) => [
        String(o.seq),
        `${o.from_message_id} … ${o.to_message_id}`,
        o.leaf_id,
        `${o.tokens_before} → ${o.tokens_after}`,
        `${o.summarizer}${o.model ? ` (${o.model})` : ""}`,
        time(o.created_at),
        el("details", {}, el("summary", {}, "summary"), el("pre", {}, o.summary)),
      ]),
    ),
    loadFailed("overlays-error", "compactions", overlays),
  );
  clear(
    $("failures"),
    failures.error && !failures.items.length ? null : table("failure-table", ["seq", "leaf", "summarizer", "attempt", "error", "recorded"], failures.items.map((f) => [String(f.seq), f.leaf_id, f.summarizer, String(f.attempt), f.error, time(f.created_at)])),
    loadFailed("failures-error", "compaction failures", failures),
  );
}

async function renderQuarantine() {
  const quarantined = [];
  let cursor;
  do { // every page: what was refused for this session, not only the newest 500
    const page = await get("/v1/quarantine", { session_id: S.sid, limit: 500, cursor });
    quarantined.push(...page.quarantined);
    cursor = page.next_cursor ?? undefined;
  } while (cursor !== undefined);
  clear(
    $("quarantine"),
    el("p", { class: "note" }, "Events stored for this session that the projectors refused, newest first."),
    table("quarantine-table", ["seq", "reason", "detail", "recorded", "bytes"], quarantined.map((q) => [String(q.seq), q.reason, q.detail, time(q.recorded_at), String(q.size)])),
  );
}

// -- erasures ------------------------------------------------------------------------------

function renderErasures() {
  clear(
    $("erasures"),
    table("erasure-table", ["session", "erased", "requested by", "reason", "seq"], erasures.map((x) => erasureCells(x, openErased)), {
      empty: "No erasures recorded for this tenant.",
      rowAttrs: (i) => ({ "data-testid": "erasure", "data-sid": erasures[i].session_id, "data-seq": erasures[i].seq }),
    }),
  );
  $("erasures-note").textContent = erasures.length ? `${plural(erasures.length, "erasure")} shown${erasuresCursor === null ? "" : ", more to load"}` : "";
  $("more-erasures").hidden = erasuresCursor === null;
}

async function loadErasures(more) {
  const ticket = ++erasuresTicket;
  $("more-erasures").disabled = true;
  $("erasures-error").textContent = "";
  try {
    const page = await get("/v1/erasures", { limit: ERASURES_PAGE, cursor: more ? erasuresCursor : undefined });
    if (ticket !== erasuresTicket) return;
    erasures = more ? erasures.concat(page.erasures) : page.erasures;
    erasuresCursor = page.next_cursor;
    renderErasures();
  } catch (e) {
    if (ticket === erasuresTicket) $("erasures-error").textContent = problem(e);
  } finally {
    if (ticket === erasuresTicket) $("more-erasures").disabled = false;
  }
}

async function showErasures() {
  showMain("erasures");
  if (erasures === null) await loadErasures(false);
}

function forgetErasures() {
  erasuresTicket += 1;
  erasures = null;
  erasuresCursor = null;
  clear($("erasures"));
  $("erasures-note").textContent = "";
  $("erasures-error").textContent = "";
  $("more-erasures").hidden = true;
  $("more-erasures").disabled = false;
}

// -- wiring ------------------------------------------------------------------------------

function debounce(fn, ms) {
  let t;
  return (...args) => { clearTimeout(t); t = setTimeout(() => fn(...args), ms); };
}

async function start() {
  $("signin-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    $("signin-error").textContent = "";
    try {
      await signIn($("api-key").value.trim());
      $("api-key").value = "";
      await showApp(true);
      await loadSessions(false);
    } catch (e) {
      $("signin-error").textContent = e instanceof ApiError && e.status === 401 ? "That key was refused." : problem(e);
    }
  });
  $("sign-out").addEventListener("click", () => {
    key.clear();
    S = null;
    loadedSessions = [];
    clear($("session-list"));
    forgetErasures();
    showMain("session");
    $("session-body").hidden = true;
    $("pick-note").hidden = false;
    showApp(false);
  });
  $("session-filter").addEventListener("input", renderSessions);
  $("session-search").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = $("session-filter").value.trim();
    (q ? searchMessages(q) : loadSessions(false)).catch((e) => { $("search-note").textContent = problem(e); });
  });
  $("more-sessions").addEventListener("click", () => loadSessions(true));
  $("show-erasures").addEventListener("click", showErasures);
  $("more-erasures").addEventListener("click", () => loadErasures(true));
  $("reload-erasures").addEventListener("click", () => loadErasures(false));
  for (const b of document.querySelectorAll("[data-tab]")) b.addEventListener("click", () => S && showTab(b.dataset.tab));
  const fromSlider = debounce(() => {
    const e = S && S.events && S.events[Number($("asof-slider").value)];
    if (e) setAsOf(e.seq);
  }, 150);
  $("asof-slider").addEventListener("input", fromSlider);
  $("asof-seq").addEventListener("change", () => {
    const seq = Number($("asof-seq").value);
    if (S && S.events && Number.isInteger(seq) && seq >= 0) setAsOf(seq);
  });
  if (key.get()) {
    try {
      await get("/v1/sessions", { limit: 1 });
      await showApp(true);
      await loadSessions(false);
      return;
    } catch {
      key.clear();
    }
  }
  showApp(false);
}

start();
