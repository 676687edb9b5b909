// Events, live: the latest events of the log, then every new one as it is sequenced, from the
// event stream (Server-Sent Events read with fetch, resumed after the last id on a drop).

import {call, latestEventId, streamEvents} from '../api.js';
import {h, clear, errorBox, field, time, pill} from '../dom.js';

const KEEP = 2000;

export async function render(main) {
  const type = h('input', {type: 'text', id: 'ev-type', placeholder: 'all; or reservation., node.offline…'});
  const form = h('form', {class: 'inline-form', 'aria-label': 'Filter events'}, field('Type or prefix', type), h('button', {type: 'submit'}, 'Apply'));
  const pause = h('button', {type: 'button', id: 'ev-pause', 'aria-pressed': 'false'}, 'Pause');
  const state = h('span', {id: 'ev-state', class: 'pill offline'}, 'connecting');
  const err = h('div');
  const list = h('ol', {id: 'event-list', class: 'events', 'aria-label': 'Events, newest first', 'aria-live': 'polite', 'aria-relevant': 'additions'});
  main.append(h('h1', {}, 'Events'), h('div', {class: 'toolbar'}, form, pause, h('span', {}, 'Stream: ', state)), err, list);

  let ctl = null;
  let paused = false;
  let held = [];
  const row = (e) => h('li', {class: 'event', dataset: {id: String(e.id), type: e.type, subject: e.subject}},
    h('span', {class: 'evid'}, `#${e.id}`), ' ', h('strong', {}, e.type), ' ', time(e.createdAt), ' ',
    h('span', {class: 'muted'}, 'subject '), h('code', {}, e.subject),
    Object.keys(e.data || {}).length ? h('details', {}, h('summary', {}, 'Data'), h('pre', {}, JSON.stringify(e.data, null, 2))) : null);
  const add = (e) => {
    if (paused) { held.push(e); return; }
    list.prepend(row(e));
    while (list.childElementCount > KEEP) list.lastElementChild.remove();
  };
  pause.addEventListener('click', () => {
    paused = !paused;
    pause.setAttribute('aria-pressed', String(paused));
    pause.textContent = paused ? `Resume (${held.length})` : 'Pause';
    if (!paused) { held.forEach(add); held = []; }
  });
  const setState = (s) => {
    if (s instanceof Error) {
      clear(err).append(errorBox(s));
      state.textContent = 'stopped';
      state.className = 'pill offline';
      return;
    }
    clear(err);
    state.textContent = s;
    state.className = `pill ${s === 'live' ? 'online' : 'offline'}`;
  };
  const start = async () => {
    if (ctl) ctl.abort();
    ctl = new AbortController();
    clear(list);
    const signal = ctl.signal;
    try {
      const last = await latestEventId(signal);
      const t = type.value.trim();
      // The last 50 events, then the stream from there.
      const first = await call('events.list', {after: Math.max(0, last - 50), limit: 50, ...(t ? {type: t} : {})}, {signal});
      first.items.forEach(add);
      const after = first.items.length ? Math.max(last, first.items[first.items.length - 1].id) : last;
      window.bcConsole.eventsFrom = after;
      streamEvents({after, type: t, signal, onEvent: add, onState: setState});
    } catch (e) {
      if (!signal.aborted) setState(e);
    }
  };
  form.addEventListener('submit', (e) => { e.preventDefault(); start(); });
  await start();
  return () => ctl && ctl.abort();
}
