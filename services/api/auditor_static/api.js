// The JSON API, called with the API key kept in this tab's session storage.

const KEY = "chronicle.apiKey";

export class ApiError extends Error {
  constructor(status, code, detail) {
    super(detail || code || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}

export const key = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

function url(path, params) {
  const u = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== "") u.searchParams.set(k, String(v));
  }
  return u;
}

async function request(path, params) {
  const r = await fetch(url(path, params), { headers: { Authorization: `Bearer ${key.get()}` } });
  if (!r.ok) {
    let problem = {};
    try { problem = await r.json(); } catch { /* not JSON */ }
    throw new ApiError(r.status, problem.code, problem.detail);
  }
  return r;
}

export const seg = (s) => encodeURIComponent(s);

/** GET a JSON answer. */
export async function get(path, params) {
  return (await request(path, params)).json();
}

/** GET an NDJSON answer as a list of objects. */
export async function getLines(path, params) {
  const text = await (await request(path, params)).text();
  return text.split("\n").filter((line) => line.trim()).map((line) => JSON.parse(line));
}

/** Every page of a paged read: ``pick`` takes a page's items, ``next`` its next cursor (null at the end).
 * A page that fails throws its error, which carries ``loaded``: the items of the pages before it. */
export async function allPages(path, params, pick, next, cursorParam = "cursor") {
  const out = [];
  let cursor;
  for (;;) {
    let page;
    try {
      page = await get(path, { ...params, [cursorParam]: cursor });
    } catch (e) {
      if (e instanceof Error) e.loaded = out;
      throw e;
    }
    out.push(...pick(page));
    cursor = next(page);
    if (cursor === null || cursor === undefined) return { items: out, last: page };
  }
}

/** Every ``key`` item of a session's list that the API pages by ``next_cursor`` (prompts,
 * compactions, compaction failures: a page ends at 1,000 items or about 4 MiB of text). */
export async function everyItem(path, key) {
  return (await allPages(path, {}, (p) => p[key], (p) => p.next_cursor)).items;
}
