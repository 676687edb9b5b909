// Reservations: reserve (after a confirmation), find the earliest free window for a shape
// (reservations.availability), see every live reservation on a timeline of the days ahead, and
// release or cancel one.

import {call, listAll, idempotencyKey} from '../api.js';
import {h, clear, errorBox, field, pill, time, fmtTime, shortId, shapeText, confirmAction, run, section} from '../dom.js';
import {loadPools} from '../store.js';
import {virtualTable} from '../vlist.js';
import {holderColor} from '../fleetmap.js';

const HOURS = 3600 * 1000;

// readShape reads the reserve form into an input of reservations.create (and, with a duration,
// of reservations.availability). Empty fields are left out: the API says what is missing.
function readShape(f) {
  const num = (el) => (el.value.trim() === '' ? undefined : Number(el.value));
  const s = {pool: f.pool.value};
  if (f.kind.value === 'gpus') s.gpus = num(f.gpus);
  if (f.kind.value === 'mig') s.migProfile = f.mig.value.trim();
  if (f.kind.value === 'timeslice') s.timeSlice = true;
  if (f.model.value.trim()) s.model = f.model.value.trim();
  if (num(f.members) && num(f.members) > 1) s.members = num(f.members);
  if (f.spot.checked) s.spot = true;
  return s;
}

function reserveForm({onReserved, onWindow}) {
  const f = {
    pool: h('select', {id: 'res-pool', required: true}),
    kind: h('select', {id: 'res-kind'},
      h('option', {value: 'gpus'}, 'whole GPUs'), h('option', {value: 'mig'}, 'a MIG slice'), h('option', {value: 'timeslice'}, 'a time-slice share')),
    gpus: h('input', {id: 'res-gpus', type: 'number', min: '1', max: '64', value: '1', inputmode: 'numeric'}),
    mig: h('input', {id: 'res-mig', type: 'text', placeholder: '3g.40gb'}),
    model: h('input', {id: 'res-model', type: 'text', placeholder: 'any (h100, a100-80gb, …)'}),
    members: h('input', {id: 'res-members', type: 'number', min: '1', value: '1'}),
    start: h('input', {id: 'res-start', type: 'datetime-local'}),
    duration: h('input', {id: 'res-duration', type: 'text', placeholder: 'until released', size: '8'}),
    spot: h('input', {id: 'res-spot', type: 'checkbox'}),
  };
  loadPools().then((ps) => f.pool.append(...ps.map((p) => h('option', {value: p.name}, p.name)))).catch(() => {});
  const out = h('div', {class: 'result', id: 'reserve-result'});
  const win = h('div', {class: 'result', id: 'availability-result'});
  const gpusField = field('GPUs', f.gpus);
  const migField = field('MIG profile', f.mig);
  const showKind = () => {
    gpusField.hidden = f.kind.value !== 'gpus';
    migField.hidden = f.kind.value !== 'mig';
  };
  f.kind.addEventListener('change', showKind);
  showKind();
  const input = () => {
    const s = readShape(f);
    if (f.start.value) s.start = new Date(f.start.value).toISOString();
    if (f.duration.value.trim()) s.duration = f.duration.value.trim();
    return s;
  };
  const findBtn = h('button', {type: 'button', id: 'res-find'}, 'Find the earliest window');
  const form = h('form', {class: 'card form', id: 'reserve-form', 'aria-label': 'Reserve capacity'},
    h('div', {class: 'grid'},
      field('Pool', f.pool), field('What', f.kind), gpusField, migField,
      field('GPU model', f.model, 'Required for a MIG slice or a share'),
      field('Members', f.members, 'A gang: each on its own node'),
      field('Start', f.start, 'Empty: now'),
      field('Duration', f.duration, 'e.g. 2h; empty: until released'),
      h('div', {class: 'field'}, h('label', {for: 'res-spot', class: 'inline'}, f.spot, ' spot (preemptible)'))),
    h('div', {class: 'actions'}, findBtn, h('button', {type: 'submit', class: 'primary', id: 'res-submit'}, 'Reserve…')),
    win, out);
  findBtn.addEventListener('click', async () => {
    const s = readShape(f);
    s.duration = f.duration.value.trim() || '1h';
    if (f.start.value) s.after = new Date(f.start.value).toISOString();
    const a = await run(win, () => call('reservations.availability', s));
    if (!a) return;
    if (!a.found) {
      win.append(h('p', {role: 'status'}, `No window of ${s.duration} fits ${shapeText(s) || 'this shape'} within the horizon.`));
      onWindow(null);
      return;
    }
    const use = h('button', {type: 'button', onclick: () => {
      const d = new Date(a.start);
      f.start.value = new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
      f.duration.value = s.duration;
      f.start.focus();
    }}, 'Use this window');
    win.append(h('p', {role: 'status', id: 'availability-window'}, 'Earliest window: ', time(a.start), ' to ', time(a.end),
      a.nodes && a.nodes.length ? ` on ${a.nodes.length} node${a.nodes.length > 1 ? 's' : ''}` : '', '. ', use));
    onWindow({start: a.start, end: a.end, label: `earliest window for ${shapeText(s) || 'the shape'}`});
  });
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const s = input();
    const when = s.start ? `from ${fmtTime(s.start)}` : 'now';
    const ok = await confirmAction({title: 'Reserve?', confirm: 'Reserve',
      body: h('p', {}, `Reserve ${shapeText(s) || 'this shape'}${s.members ? ` × ${s.members} members` : ''} in pool ${s.pool}, ${when}, ${s.duration ? `for ${s.duration}` : 'until released'}${s.spot ? ', as spot' : ''}.`)});
    if (!ok) return;
    const key = idempotencyKey();
    const r = await run(out, () => call('reservations.create', s, {idempotencyKey: key}), (x) =>
      h('span', {}, 'Reserved: ', h('a', {href: `#/reservations?focus=${x.id}`, id: 'reserved-id', dataset: {id: x.id}}, x.id), ` (${x.state}) on `,
        x.allocations.map((al) => `${al.node} GPU ${al.gpus.map((g) => g.index).join(',') || '—'}`).join('; '), '. ',
        h('a', {href: '#/fleet'}, 'See it on the fleet map'), '.'));
    if (r) onReserved(r);
  });
  return form;
}

// timeline draws live reservations (and the earliest window found) over the next hours.
function timeline() {
  const horizon = h('select', {id: 'tl-horizon'},
    h('option', {value: '24'}, 'next 24 hours'), h('option', {value: '168', selected: true}, 'next 7 days'), h('option', {value: '720'}, 'next 30 days'));
  const axis = h('div', {class: 'axis', 'aria-hidden': 'true'});
  let from = Date.now();
  let to = from + 168 * HOURS;
  let rows = [];
  let windowRow = null;
  const pct = (t) => Math.max(0, Math.min(100, (100 * (t - from)) / (to - from)));
  const vt = virtualTable({
    caption: 'Timeline of reservations',
    rowHeight: 32,
    height: '40vh',
    columns: [
      {title: 'Reservation', width: '16rem', cell: (r) => (r.window ? h('strong', {}, 'Earliest free window')
        : [h('a', {href: `#/reservations?focus=${r.id}`, title: r.id}, shortId(r.id)), ' ', pill(r.state), ' ', shapeText(r.shape)])},
      {title: 'Window', width: '1fr', cell: (r) => {
        const s = Date.parse(r.startsAt);
        const e = r.endsAt ? Date.parse(r.endsAt) : to;
        const text = r.window ? `${r.label}: ${fmtTime(r.startsAt)} to ${fmtTime(r.endsAt)}`
          : `${shapeText(r.shape)}: ${fmtTime(r.startsAt)} to ${r.endsAt ? fmtTime(r.endsAt) : 'when released'}`;
        return h('div', {class: 'track'}, h('span', {class: r.window ? 'span window' : `span ${r.state}`, title: text, 'aria-label': text,
          style: `left:${pct(s)}%;width:${Math.max(0.5, pct(e) - pct(s))}%;${r.window ? '' : `background:${holderColor(r.id)}`}`},
        h('span', {class: 'visually-hidden'}, text)), r.endsAt ? null : h('span', {class: 'open-end', 'aria-hidden': 'true', style: `left:${pct(s)}%`}));
      }},
    ],
    empty: 'Nothing is booked in this window.',
  });
  const drawAxis = () => {
    const hours = (to - from) / HOURS;
    const step = hours <= 24 ? 3 * HOURS : hours <= 168 ? 24 * HOURS : 5 * 24 * HOURS;
    const fmt = new Intl.DateTimeFormat(undefined, step < 24 * HOURS ? {hour: '2-digit', minute: '2-digit'} : {month: 'short', day: 'numeric'});
    const ticks = [];
    // Ticks at local midnights (days) or whole hours, none too close to either edge.
    const d = new Date(from);
    if (step >= 24 * HOURS) d.setHours(24, 0, 0, 0);
    else d.setHours(d.getHours() + 1, 0, 0, 0);
    for (let t = d.getTime(); t < to; t += step) {
      if (pct(t) > 4 && pct(t) < 94) ticks.push(h('span', {style: `left:${pct(t)}%`}, fmt.format(new Date(t))));
    }
    clear(axis).append(h('span', {class: 'now', style: 'left:0'}, 'now'), ...ticks);
  };
  const redraw = () => {
    from = Date.now();
    to = from + Number(horizon.value) * HOURS;
    drawAxis();
    const shown = rows.filter((r) => Date.parse(r.startsAt) < to && (!r.endsAt || Date.parse(r.endsAt) > from));
    vt.setRows(windowRow ? [windowRow, ...shown] : shown);
  };
  horizon.addEventListener('change', redraw);
  const el = h('div', {class: 'timeline'}, h('div', {class: 'toolbar'}, field('Show', horizon)),
    h('div', {class: 'axisrow'}, h('span', {}), axis), vt.el);
  return {
    el,
    setRows(r) { rows = r; redraw(); },
    setWindow(w) { windowRow = w ? {window: true, id: 'window', startsAt: w.start, endsAt: w.end, label: w.label} : null; redraw(); },
  };
}

export async function render(main, {query}) {
  main.append(h('h1', {}, 'Reservations'));
  const focus = query.get('focus');
  const detail = h('div', {id: 'reservation-detail'});
  const actionOut = h('div', {class: 'result', id: 'reservation-action'});
  const state = h('select', {id: 'res-state'},
    h('option', {value: 'live'}, 'pending and active'),
    ...['pending', 'active', 'released', 'cancelled', 'expired', 'preempted'].map((s) => h('option', {value: s}, s)));
  const listErr = h('div');
  const nodesOf = (r) => (r.allocations || []).map((a) => a.node).join(', ');

  const act = async (r, verb) => {
    const method = verb === 'Release' ? 'reservations.release' : 'reservations.cancel';
    const ok = await confirmAction({title: `${verb} reservation ${shortId(r.id)}?`, confirm: verb, danger: true,
      body: h('p', {}, `${verb === 'Release' ? 'It ends now' : 'It will not start'}: ${shapeText(r.shape)} on ${nodesOf(r) || 'its nodes'} go back to the pool.`)});
    if (!ok) return;
    const key = idempotencyKey();
    const x = await run(actionOut, () => call(method, {reservation: r.id}, {idempotencyKey: key}), (y) => `Reservation ${y.id} is ${y.state}.`);
    if (x) await refresh();
  };
  const vt = virtualTable({
    caption: 'Reservations',
    rowHeight: 40,
    columns: [
      {title: 'Reservation', width: '1fr', cell: (r) => h('a', {href: `#/reservations?focus=${r.id}`, title: r.id, dataset: {id: r.id}}, shortId(r.id))},
      {title: 'State', width: '0.9fr', cell: (r) => pill(r.state)},
      {title: 'Shape', width: '1.4fr', cell: (r) => shapeText(r.shape) + (r.members > 1 ? ` × ${r.members}` : '') + (r.spot ? ' (spot)' : '')},
      {title: 'Nodes', width: '1.4fr', cell: nodesOf},
      {title: 'Starts', width: '1.2fr', cell: (r) => time(r.startsAt)},
      {title: 'Ends', width: '1.2fr', cell: (r) => (r.endsAt ? time(r.endsAt) : 'when released')},
      {title: 'Action', width: '0.9fr', cell: (r) => (r.state === 'active'
        ? h('button', {type: 'button', class: 'small danger', 'aria-label': `Release ${r.id}`, onclick: () => act(r, 'Release')}, 'Release')
        : r.state === 'pending'
          ? h('button', {type: 'button', class: 'small danger', 'aria-label': `Cancel ${r.id}`, onclick: () => act(r, 'Cancel')}, 'Cancel')
          : '')},
    ],
    empty: 'No reservation in this state.',
  });
  const tl = timeline();

  const refresh = async () => {
    try {
      const states = state.value === 'live' ? ['active', 'pending'] : [state.value];
      const lists = await Promise.all(states.map((s) => listAll('reservations.list', {state: s}, {max: 20000})));
      const rows = lists.flat().sort((a, b) => (a.startsAt < b.startsAt ? -1 : 1));
      vt.setRows(rows);
      const live = state.value === 'live' ? rows : (await Promise.all(['active', 'pending'].map((s) => listAll('reservations.list', {state: s}, {max: 20000})))).flat();
      tl.setRows(live.sort((a, b) => (a.startsAt < b.startsAt ? -1 : 1)));
      clear(listErr);
    } catch (e) {
      clear(listErr).append(errorBox(e));
    }
  };
  const showFocus = async () => {
    if (!focus) return;
    try {
      const r = await call('reservations.get', {reservation: focus});
      clear(detail).append(section(`Reservation ${shortId(r.id)}`,
        h('dl', {class: 'facts'},
          h('dt', {}, 'Id'), h('dd', {}, h('code', {}, r.id)),
          h('dt', {}, 'State'), h('dd', {id: 'focus-state'}, pill(r.state)),
          h('dt', {}, 'Shape'), h('dd', {}, shapeText(r.shape), r.members > 1 ? ` × ${r.members}` : ''),
          h('dt', {}, 'Window'), h('dd', {}, time(r.startsAt), ' to ', r.endsAt ? time(r.endsAt) : 'when released'),
          r.endReason ? [h('dt', {}, 'Ended'), h('dd', {}, r.endReason, r.endedBy ? ` by ${r.endedBy}` : '')] : null,
          h('dt', {}, 'Holds'), h('dd', {}, h('ul', {class: 'plain'}, r.allocations.map((a) => h('li', {},
            h('a', {href: `#/node/${a.nodeId}`}, a.node), ': GPU ', a.gpus.map((g) => g.index + (g.migProfile ? ` (${g.migProfile})` : '') + (g.share !== undefined ? ` (share ${g.share})` : '')).join(', ') || '—'))))),
        r.state === 'active' ? h('button', {type: 'button', class: 'danger', id: 'focus-release', onclick: async () => { await act(r, 'Release'); await showFocus(); }}, 'Release…')
          : r.state === 'pending' ? h('button', {type: 'button', class: 'danger', onclick: async () => { await act(r, 'Cancel'); await showFocus(); }}, 'Cancel…') : null));
    } catch (e) {
      clear(detail).append(errorBox(e));
    }
  };
  state.addEventListener('change', refresh);
  main.append(detail, actionOut,
    section('Reserve', reserveForm({onReserved: () => refresh(), onWindow: (w) => tl.setWindow(w)})),
    section('Timeline', tl.el),
    section('All reservations', h('div', {class: 'toolbar'}, field('State', state)), listErr, vt.el));
  await Promise.all([refresh(), showFocus()]);
  const timer = setInterval(refresh, 5000);
  return () => clearInterval(timer);
}
