// Rendering one message (text, reasoning, tool calls and results, markers) and a summary overlay.

import { el, json, time } from "./dom.js";

function partView(part) {
  if (!part || typeof part !== "object") return el("pre", { class: "part raw" }, json(part));
  const type = String(part.type || "");
  if (type === "text") return el("div", { class: "part text" }, String(part.text ?? ""));
  if (type === "reasoning") {
    return el("details", { class: "part reasoning" }, el("summary", {}, "reasoning"), String(part.text ?? ""));
  }
  if (type === "dynamic-tool" || type.startsWith("tool-")) {
    const name = part.toolName || type.replace(/^tool-/, "");
    const output = part.output;
    const unloaded = typeof output === "string" && output.startsWith("[skill unloaded: ");
    return el(
      "div",
      { class: "part tool", "data-testid": "tool-part" },
      el("div", { class: "tool-call" }, el("b", {}, "tool call "), `${name}`, el("span", { class: "note" }, ` ${part.toolCallId || ""} · ${part.state || ""}`)),
      part.input !== undefined ? el("pre", { class: "tool-input" }, json(part.input)) : null,
      output !== undefined
        ? el(
            "div",
            { class: unloaded ? "tool-result unloaded" : "tool-result", "data-testid": unloaded ? "unload-marker" : "tool-result" },
            el("b", {}, unloaded ? "" : "result "),
            el("pre", {}, typeof output === "string" ? output : json(output)),
          )
        : null,
      part.errorText ? el("div", { class: "error" }, String(part.errorText)) : null,
    );
  }
  return el("details", { class: "part raw" }, el("summary", {}, type || "part"), el("pre", {}, json(part)));
}

/** A message card. ``extra`` adds nodes to its header (badges, buttons). */
export function messageView(node, { prompt, onOriginal, extra } = {}) {
  const msg = node.message || {};
  const parts = Array.isArray(msg.parts) ? msg.parts : [];
  const card = el(
    "li",
    { class: `msg role-${String(node.role).replace(/[^a-z0-9_-]/gi, "")}`, "data-testid": "message", "data-id": node.id },
    el(
      "div",
      { class: "msg-head" },
      el("span", { class: "role" }, node.role),
      el("code", { class: "mid" }, node.id),
      el("span", { class: "note" }, `seq ${node.seq} · ${time(node.created_at)}`),
      prompt ? el("span", { class: "badge", title: "the system prompt in force" }, `prompt v${prompt.version}`) : null,
      ...(node.unloaded || []).map((k) => el("span", { class: "badge warn" }, `skill unloaded: ${k}`)),
      node.capped ? el("span", { class: "badge warn", "data-testid": "capped" }, "capped") : null,
      node.capped && onOriginal
        ? el("button", { type: "button", class: "link", "data-testid": "show-original", onclick: (e) => onOriginal(node, e.target.closest("li")) }, "show original")
        : null,
      extra || null,
    ),
    parts.map(partView),
  );
  return card;
}

/** A summary overlay drawn over the range of ``covered`` message ids it replaces. */
export function overlayView(overlay, covered, renderCovered) {
  const box = el("li", { class: "overlay", "data-testid": "overlay", "data-overlay": overlay.id });
  const list = el("ol", { class: "covered", hidden: true, "data-testid": "covered" });
  let filled = false;
  const toggle = el(
    "button",
    {
      type: "button",
      class: "link",
      "data-testid": "toggle-covered",
      onclick: () => {
        if (!filled) {
          list.append(...covered.map(renderCovered));
          filled = true;
        }
        list.hidden = !list.hidden;
        toggle.textContent = list.hidden ? `show the ${covered.length} replaced messages` : "hide them";
      },
    },
    `show the ${covered.length} replaced messages`,
  );
  box.append(
    el(
      "div",
      { class: "overlay-head" },
      el("b", {}, "Summary overlay"),
      el("span", { class: "note" }, ` replaces ${covered.length} messages, ${overlay.from_message_id} … ${overlay.to_message_id}`),
      el("span", { class: "note" }, ` · ${overlay.tokens_before} → ${overlay.tokens_after} tokens · ${overlay.summarizer} · seq ${overlay.seq}`),
    ),
    el("div", { class: "summary", "data-testid": "summary" }, overlay.summary),
    toggle,
    list,
  );
  return box;
}
