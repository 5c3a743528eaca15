// The tenant's erasures (GET /v1/erasures): who erased which session, when and why. Reasons and
// session ids are tenant input: they go into the page as text only (dom.js's el).

import { el, time } from "./dom.js";

export const NOT_RECORDED = "not recorded";

/** A field of an erasure's record, or a visible "not recorded" for null (erasures recorded
 * before who and why were kept; ``seq`` of one interrupted before its event was published). */
export function recorded(value, render = String) {
  if (value === null || value === undefined) return el("span", { class: "note not-recorded" }, NOT_RECORDED);
  if (value === "") return el("span", { class: "note" }, "(empty)");
  return render(value);
}

/** Whether the view can open the erasure's session at its ``session.erased`` event: a session's
 * (not the tenant-level entries', ``session_id`` ""), with that event published. */
export function openable(erasure) {
  return erasure.session_id !== "" && Number.isInteger(erasure.seq);
}

function sessionCell(erasure) {
  if (erasure.session_id === "") {
    return el("span", { class: "note", title: "chronicle erase --yes: the tenant's skills and other tenant-level entries" }, "(tenant-level entries)");
  }
  return el("code", { class: "long", "data-testid": "erasure-sid" }, erasure.session_id);
}

function seqCell(erasure, onOpen) {
  if (!openable(erasure)) return recorded(erasure.seq);
  return el(
    "button",
    { type: "button", class: "link", "data-testid": "erasure-seq", title: "show this session.erased event on the session's timeline", onclick: () => onOpen(erasure) },
    String(erasure.seq),
  );
}

/** The cells of one row of the erasures table: session, when, who asked, why, seq (``onOpen``:
 * called with the erasure when its seq is clicked). */
export function erasureCells(erasure, onOpen) {
  return [
    sessionCell(erasure),
    time(erasure.erased_at),
    el("span", { class: "long" }, recorded(erasure.requested_by)),
    el("span", { class: "long", "data-testid": "erasure-reason" }, recorded(erasure.reason)),
    seqCell(erasure, onOpen),
  ];
}

/** What the view says on an erased session's page: when, who, why. */
export function erasedNote(erasure) {
  return [
    el("b", {}, "Erased"),
    erasure.erased_at ? ` ${time(erasure.erased_at)}` : "",
    " · requested by ",
    recorded(erasure.requested_by),
    " · reason: ",
    el("span", { "data-testid": "erased-reason" }, recorded(erasure.reason)),
    ". What it held can never be read again; its events remain in the log as tombstones.",
  ];
}

/** An erasure's record as a session's ``session.erased`` event line tells it (GET
 * …/events: ``{seq, event}``), or null when the line is no such event. */
export function erasureFromEvent(sid, line) {
  const ev = line && line.event;
  if (!ev || ev.type !== "session.erased") return null;
  return { session_id: sid, erased_at: ev.occurred_at ?? null, requested_by: ev.requested_by ?? null, reason: ev.reason ?? null, seq: line.seq };
}
