// Building DOM nodes: text always goes in as text (stored messages are untrusted).

/** ``el("div", {class: "x", "data-testid": "y", onclick: f}, child, "text", ...)`` */
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = String(v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export function clear(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== undefined && c !== null && c !== false));
}

export const $ = (id) => document.getElementById(id);

export function time(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function json(value) {
  return JSON.stringify(value, null, 2);
}

/** Pager buttons: "‹ prev · a–b of n · next ›"; ``go(page)`` is called on a click. */
export function pager(container, view, size, total, go, testid) {
  if (total <= size) {
    clear(container);
    return;
  }
  clear(
    container,
    el("button", { type: "button", disabled: view.page <= 1, onclick: () => go(1), "data-testid": `${testid}-first` }, "« first"),
    el("button", { type: "button", disabled: view.page <= 1, onclick: () => go(view.page - 1), "data-testid": `${testid}-prev` }, "‹ prev"),
    el("span", { "data-testid": `${testid}-range` }, `${view.start + 1}–${Math.min(view.start + size, total)} of ${total}`),
    el("button", { type: "button", disabled: view.page >= view.pages, onclick: () => go(view.page + 1), "data-testid": `${testid}-next` }, "next ›"),
    el("button", { type: "button", disabled: view.page >= view.pages, onclick: () => go(view.pages), "data-testid": `${testid}-last` }, "last »"),
  );
}
