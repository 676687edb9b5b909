// Small DOM helpers: an element builder, the error box every view shows API errors in, the
// confirmation dialog every action goes through, and formatting.

import {ApiError} from './api.js';

// h builds an element: h('a', {href, class, onclick, 'aria-label': …}, child, …). Children are
// nodes, strings (text, never HTML), arrays, or null/false (skipped).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'style') setStyle(el, v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'value' || k === 'checked' || k === 'selected' || k === 'disabled' || k === 'hidden') el[k] = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  append(el, children);
  return el;
}

// setStyle applies declarations through the CSSOM: the page's Content-Security-Policy refuses
// inline style attributes, but not styles set from its own scripts.
function setStyle(el, css) {
  for (const decl of css.split(';')) {
    const i = decl.indexOf(':');
    if (i > 0) el.style.setProperty(decl.slice(0, i).trim(), decl.slice(i + 1).trim());
  }
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

// errorBox shows an error as the API gave it: its code, its message, its details.
export function errorBox(err) {
  if (!(err instanceof ApiError)) {
    return h('div', {class: 'error', role: 'alert'}, h('strong', {}, 'error'), ' ', String(err && err.message ? err.message : err));
  }
  return h('div', {class: 'error', role: 'alert', dataset: {code: err.code}},
    h('strong', {class: 'code'}, err.code), ' ', h('span', {class: 'message'}, err.message),
    err.details && Object.keys(err.details).length
      ? h('details', {}, h('summary', {}, 'Details'), h('pre', {}, JSON.stringify(err.details, null, 2)))
      : null);
}

// announce tells screen readers (and tests) what just happened.
export function announce(msg) {
  const s = document.getElementById('status');
  s.textContent = '';
  setTimeout(() => { s.textContent = msg; }, 30);
}

// confirmAction asks before an action: the dialog names what will happen; it answers true only
// for an explicit confirmation. The dialog is modal (focus stays in it; Escape cancels).
export function confirmAction({title, body, confirm = 'Confirm', danger = false}) {
  const dlg = document.getElementById('confirm');
  document.getElementById('confirm-title').textContent = title;
  const b = clear(document.getElementById('confirm-body'));
  append(b, [body]);
  const ok = document.getElementById('confirm-ok');
  ok.textContent = confirm;
  ok.className = danger ? 'danger' : 'primary';
  dlg.returnValue = 'cancel';
  return new Promise((resolve) => {
    dlg.addEventListener('close', () => resolve(dlg.returnValue === 'ok'), {once: true});
    dlg.showModal();
    document.getElementById('confirm-cancel').focus();
  });
}

// run runs an action, showing its error (as the API gave it) in place, or its success.
export async function run(slot, fn, success) {
  clear(slot);
  try {
    const out = await fn();
    if (success) {
      const msg = typeof success === 'function' ? success(out) : success;
      slot.append(h('div', {class: 'ok', role: 'status'}, msg));
      announce(typeof msg === 'string' ? msg : msg.textContent);
    }
    return out;
  } catch (err) {
    slot.append(errorBox(err));
    return undefined;
  }
}

const timeFmt = new Intl.DateTimeFormat(undefined, {month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit'});

export function fmtTime(iso) {
  if (!iso) return '—';
  return timeFmt.format(new Date(iso));
}

export function time(iso) {
  return iso ? h('time', {datetime: iso}, fmtTime(iso)) : '—';
}

export function fmtBytes(n) {
  if (!n) return '0 B';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  const i = Math.min(u.length - 1, Math.floor(Math.log2(n) / 10));
  return `${(n / 2 ** (10 * i)).toFixed(i ? 1 : 0)} ${u[i]}`;
}

// shortId is an id's last characters, enough to tell reservations apart on screen; the full id
// is in the element's title and in links.
export function shortId(id) {
  return id ? id.slice(-8) : '';
}

export function pill(text, kind) {
  return h('span', {class: `pill ${kind || text}`}, text);
}

export function shapeText(s) {
  if (!s) return '';
  const parts = [];
  if (s.gpus) parts.push(`${s.gpus}× ${s.model || 'GPU'}${s.nvlink ? ' (NVLink)' : ''}`);
  if (s.migProfile) parts.push(`MIG ${s.migProfile} of ${s.model}`);
  if (s.timeSlice) parts.push(`time-slice of ${s.model}`);
  if (s.vcpus) parts.push(`${s.vcpus} vCPU`);
  if (s.memoryGiB) parts.push(`${s.memoryGiB} GiB`);
  return parts.join(' + ');
}

// section is a titled region of a view.
let sections = 0;

export function section(title, ...children) {
  const id = 'h-' + title.toLowerCase().replace(/[^a-z0-9]+/g, '-') + '-' + ++sections;
  return h('section', {'aria-labelledby': id}, h('h2', {id}, title), ...children);
}

// field is a labelled form control.
export function field(label, control, hint) {
  const id = control.id || 'f-' + Math.random().toString(36).slice(2, 9);
  control.id = id;
  const hintEl = hint ? h('span', {class: 'hint', id: id + '-hint'}, hint) : null;
  if (hintEl) control.setAttribute('aria-describedby', id + '-hint');
  return h('div', {class: 'field'}, h('label', {for: id}, label), control, hintEl);
}

// table builds a plain table: columns [{title, cell(row)}].
export function table(caption, columns, rows, empty = 'Nothing yet.') {
  if (!rows.length) return h('p', {class: 'muted'}, empty);
  return h('table', {},
    h('caption', {class: caption.startsWith('!') ? 'visually-hidden' : ''}, caption.replace(/^!/, '')),
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', {scope: 'col'}, c.title)))),
    h('tbody', {}, rows.map((r) => h('tr', {}, columns.map((c) => h('td', {}, c.cell(r)))))));
}

// poll runs fn now and every ms until stopped; it returns the stop function.
export function poll(fn, ms) {
  let stopped = false;
  let timer = null;
  const tick = async () => {
    try { await fn(); } catch { /* the view shows its own errors */ }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  return () => { stopped = true; clearTimeout(timer); };
}
