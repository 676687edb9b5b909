// The API client: every call the console makes goes through call(), as POST
// <apiPath><group>/<method> with the signed-in person's credential; nothing else reaches the
// control plane. Errors arrive as ApiError with the API's own code, message and details.

const store = window.sessionStorage;
const KEY = 'bc.credential';
const HOW = 'bc.how';

let apiPath = '/api/compute/';

export function configure(cfg) {
  apiPath = cfg.apiPath || apiPath;
}

export function credential() {
  return store.getItem(KEY);
}

// signedInWith says how the credential was had: "key" (pasted) or "session" (the host's).
export function signedInWith() {
  return store.getItem(HOW) || '';
}

export function setCredential(cred, how) {
  store.setItem(KEY, cred);
  store.setItem(HOW, how);
}

export function signOut() {
  store.removeItem(KEY);
  store.removeItem(HOW);
}

// ApiError is an answer of the API's error envelope: {"error": {code, message, details}}.
export class ApiError extends Error {
  constructor(status, e) {
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || 'unavailable';
    this.details = e.details || null;
  }
}

async function answer(res) {
  const text = await res.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : {};
  } catch {
    body = null;
  }
  if (!res.ok || body === null) {
    const e = body && body.error ? body.error : {code: res.status >= 500 ? 'unavailable' : 'internal', message: `HTTP ${res.status}: the answer was not the API's JSON`};
    throw new ApiError(res.status, e);
  }
  return body;
}

function headers(extra) {
  const h = {'Content-Type': 'application/json', ...extra};
  const c = credential();
  if (c) h.Authorization = 'Bearer ' + c;
  return h;
}

// call invokes method ("group.name") with input. A mutation may carry an idempotency key, so
// that a retry of the same confirmed action acts once.
export async function call(method, input = {}, {signal, idempotencyKey} = {}) {
  const [group, name] = method.split('.');
  const extra = idempotencyKey ? {'Idempotency-Key': idempotencyKey} : {};
  let res;
  try {
    res = await fetch(`${apiPath}${group}/${name}`, {method: 'POST', headers: headers(extra), body: JSON.stringify(input), signal});
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new ApiError(0, {code: 'unavailable', message: `the API could not be reached: ${err.message}`});
  }
  return answer(res);
}

// listAll reads every page of a list method, up to max items.
export async function listAll(method, input = {}, {max = 100000, limit = 500, signal} = {}) {
  const items = [];
  let cursor = '';
  for (;;) {
    const page = await call(method, {...input, limit, ...(cursor ? {cursor} : {})}, {signal});
    items.push(...page.items);
    if (!page.nextCursor || items.length >= max) return items;
    cursor = page.nextCursor;
  }
}

// methods answers the served method table (GET <apiPath>methods), which says what modules serve.
export async function methods() {
  const res = await fetch(`${apiPath}methods`, {headers: headers()});
  return (await answer(res)).methods;
}

// latestEventId finds the id of the log's last event with a few events.list calls (ids have no
// gap: an exponential probe, then a bisection), so that a view can start at the present.
export async function latestEventId(signal) {
  const has = async (after) => (await call('events.list', {after, limit: 1}, {signal})).items.length > 0;
  if (!(await has(0))) return 0;
  let lo = 0;
  let hi = 1;
  while (await has(hi)) {
    lo = hi;
    hi *= 2;
  }
  // Events after lo exist; none after hi.
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (await has(mid)) lo = mid;
    else hi = mid;
  }
  return hi;
}

// streamEvents follows the event stream (GET <apiPath>events/stream, Server-Sent Events) with
// fetch, since EventSource cannot send the credential. It resumes after the last event it
// handed over (Last-Event-ID) when the connection drops, and stops when signal aborts.
// onState hears "live", "reconnecting" or an ApiError.
export async function streamEvents({after = 0, type = '', onEvent, onState, signal}) {
  let last = after;
  let delay = 500;
  while (!signal.aborted) {
    try {
      const q = type ? `?type=${encodeURIComponent(type)}` : '';
      const res = await fetch(`${apiPath}events/stream${q}`, {headers: {...headers(), 'Last-Event-ID': String(last), Accept: 'text/event-stream'}, signal});
      if (!res.ok) {
        const err = await answer(res).catch((e) => e);
        onState(err);
        if (err.status === 401 || err.status === 403 || err.status === 400) return;
        throw err;
      }
      onState('live');
      delay = 500;
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buf += value;
        let cut;
        while ((cut = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const ev = parseBlock(block);
          if (ev.event === 'error' && ev.data) {
            onState(new ApiError(0, JSON.parse(ev.data).error));
          } else if (ev.data) {
            const e = JSON.parse(ev.data);
            last = e.id;
            onEvent(e);
          }
        }
      }
    } catch (err) {
      if (signal.aborted) return;
    }
    if (signal.aborted) return;
    onState('reconnecting');
    await new Promise((r) => setTimeout(r, delay * (0.8 + Math.random() * 0.4)));
    delay = Math.min(delay * 2, 10000);
  }
}

function parseBlock(block) {
  const ev = {event: 'message', data: ''};
  for (const line of block.split('\n')) {
    if (line.startsWith(':')) continue;
    const i = line.indexOf(':');
    const field = i < 0 ? line : line.slice(0, i);
    const value = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
    if (field === 'event') ev.event = value;
    else if (field === 'data') ev.data += (ev.data ? '\n' : '') + value;
    else if (field === 'id') ev.id = value;
  }
  return ev;
}

// idempotencyKey names one confirmed action.
// (crypto.randomUUID exists only in secure contexts; a console on plain http elsewhere than
// loopback has getRandomValues alone.)
export function idempotencyKey() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return 'console-' + Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}
