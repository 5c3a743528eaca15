// Pure functions over a session's message tree (no DOM, no fetch).

/** Index tree nodes ({id, parent_id, seq, ...}, in append order) by id and by parent. */
export function buildTree(nodes) {
  const byId = new Map();
  const children = new Map();
  for (const n of nodes) byId.set(n.id, n);
  for (const n of nodes) {
    const parent = n.parent_id !== null && byId.has(n.parent_id) ? n.parent_id : null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(n);
  }
  return { byId, children };
}

/** Ids from the root to ``leafId`` (a deleted ancestor ends the path there, as the server's). */
export function pathTo(tree, leafId) {
  const out = [];
  const seen = new Set();
  let node = tree.byId.get(leafId);
  while (node && !seen.has(node.id)) {
    seen.add(node.id);
    out.push(node.id);
    node = node.parent_id === null ? undefined : tree.byId.get(node.parent_id);
  }
  return out.reverse();
}

/** Nodes without children, newest first. */
export function leaves(tree) {
  const out = [];
  for (const n of tree.byId.values()) if (!(tree.children.get(n.id) || []).length) out.push(n);
  return out.sort((a, b) => b.seq - a.seq);
}

/** The newest leaf under ``id`` (the node itself when it has no children). */
export function latestLeafUnder(tree, id) {
  let best = null;
  const stack = [id];
  while (stack.length) {
    const cur = stack.pop();
    const kids = tree.children.get(cur) || [];
    if (!kids.length) {
      const n = tree.byId.get(cur);
      if (best === null || n.seq > best.seq) best = n;
    }
    for (const k of kids) stack.push(k.id);
  }
  return best.id;
}

/** The compacted view of a path, as the server applies it (projections/overlay_rule.py): at
 * each index, of the overlays starting there whose end is on the path at or after it, the widest
 * (ties: the newest) replaces that range. Returns items ``{id}`` or ``{overlay, covered: [ids]}``. */
export function applyOverlays(pathIds, overlays) {
  const index = new Map(pathIds.map((id, i) => [id, i]));
  const sorted = [...overlays].sort((a, b) => a.seq - b.seq);
  const out = [];
  let i = 0;
  while (i < pathIds.length) {
    let best = null;
    let reach = -1;
    for (const ov of sorted) {
      const end = index.get(ov.to_message_id);
      if (ov.from_message_id === pathIds[i] && end !== undefined && end >= i && end >= reach) {
        best = ov;
        reach = end;
      }
    }
    if (best === null) {
      out.push({ id: pathIds[i] });
      i += 1;
    } else {
      out.push({ overlay: best, covered: pathIds.slice(i, reach + 1) });
      i = reach + 1;
    }
  }
  return out;
}

/** The prompt version in force at stream sequence ``seq`` (the newest recorded at or before it), or null. */
export function promptAt(prompts, seq) {
  let found = null;
  for (const p of prompts) if (p.seq <= seq && (found === null || p.version > found.version)) found = p;
  return found;
}

/** A message event's id and role: written in it, or (stored compact: message.appended v3,
 * message.updated v2) its inline body's. */
function messageId(event) {
  return event.message_id ?? event.message?.id ?? "";
}

function messageRole(event) {
  return event.role ?? event.message?.role ?? "";
}

/** Who did it, as far as the event says: the role of a message, the writer of a block, the
 * summarizer of a compaction, the reason of a prompt, who asked for an erasure. */
export function who(event) {
  if (!event) return "";
  switch (event.type) {
    case "message.appended":
    case "message.updated":
      return String(messageRole(event));
    case "context.written":
      return event.writer || "";
    case "compaction.recorded":
    case "compaction.failed":
      return event.summarizer || "";
    case "prompt.rendered":
      return event.reason || "";
    case "session.erased":
      return event.requested_by || "";
    default:
      return event.correlation_id || "";
  }
}

/** What the event is about, in a few words: the message and its parent, the block, the prompt
 * version, the overlay's range, the deleted ids, why a session ended or was erased. */
export function what(event) {
  if (!event) return "";
  switch (event.type) {
    case "message.appended":
      return `${messageId(event)} ← ${event.parent_id ?? "(root)"}${event.original_ref ? " · capped" : ""}`;
    case "message.updated":
      return messageId(event);
    case "messages.deleted":
      return (event.message_ids || []).join(", ");
    case "context.written":
      return `${event.label} (${event.mode}, ${event.tokens} tokens)`;
    case "search_entry.indexed":
      return `${event.label}: ${event.key}`;
    case "skill.loaded":
    case "skill.unloaded":
      return `${event.label}: ${event.key}${event.message_id ? ` in ${event.message_id}` : ""}`;
    case "prompt.rendered":
      return `v${event.version_no} (${event.tokens} tokens)`;
    case "compaction.recorded":
      return `${event.from_message_id} … ${event.to_message_id} on ${event.leaf_id}`;
    case "compaction.failed":
      return `${event.error} (attempt ${event.attempt})`;
    case "session.created":
    case "session.renamed":
      return event.name || "";
    case "session.usage_added":
      return `+${event.input_tokens} in, +${event.output_tokens} out, +${event.cost} cost`;
    case "session.ended":
    case "session.erased":
      return event.reason || "";
    default:
      return "";
  }
}

/** One page of ``items`` (1-based ``page``), and the page count. */
export function pageOf(items, page, size) {
  const pages = Math.max(1, Math.ceil(items.length / size));
  const p = Math.min(Math.max(1, page), pages);
  return { page: p, pages, items: items.slice((p - 1) * size, p * size), start: (p - 1) * size };
}
