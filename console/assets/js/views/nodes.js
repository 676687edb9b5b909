// Nodes: the list (virtualised: a fleet of 10,000 costs what a page does) and a node's page with
// each GPU, its mode, health and holders, its reservations and commands, and its actions.

import {call, listAll, idempotencyKey} from '../api.js';
import {h, clear, errorBox, section, table, pill, time, shortId, confirmAction, run, field, poll} from '../dom.js';
import {loadFleet, loadPools, gpuCounts} from '../store.js';
import {virtualTable} from '../vlist.js';
import {commandForm} from './commands.js';

export async function renderList(main) {
  main.append(h('h1', {}, 'Nodes'));
  const [fleet, pools] = await Promise.all([loadFleet(), loadPools()]);
  const poolName = new Map(pools.map((p) => [p.id, p.name]));
  const filter = h('input', {type: 'search', id: 'node-filter', placeholder: 'name, pool, state…'});
  const count = h('p', {class: 'muted', 'aria-live': 'polite'});
  const vt = virtualTable({
    caption: 'Nodes',
    columns: [
      {title: 'Name', width: '2fr', cell: (n) => h('a', {href: `#/node/${n.id}`}, n.name)},
      {title: 'Pool', cell: (n) => poolName.get(n.poolId) || shortId(n.poolId)},
      {title: 'State', cell: (n) => pill(n.state)},
      {title: 'Session', cell: (n) => pill(n.status)},
      {title: 'Health', cell: (n) => pill(n.health)},
      {title: 'GPUs free', cell: (n) => { const c = gpuCounts(n); return `${c.free} of ${c.total}`; }},
    ],
    empty: 'No node matches.',
  });
  const apply = () => {
    const q = filter.value.trim().toLowerCase();
    const rows = q ? fleet.nodes.filter((n) => `${n.name} ${poolName.get(n.poolId) || ''} ${n.state} ${n.status} ${n.health}`.toLowerCase().includes(q)) : fleet.nodes;
    vt.setRows(rows);
    count.textContent = `${rows.length} of ${fleet.nodes.length} nodes`;
  };
  filter.addEventListener('input', apply);
  main.append(h('div', {class: 'toolbar'}, field('Filter', filter)), count, vt.el);
  apply();
}

function holderList(d) {
  if (!d.holders.length) return h('span', {class: 'muted'}, 'free');
  return h('ul', {class: 'plain'}, d.holders.map((x) => h('li', {},
    h('a', {href: `#/reservations?focus=${x.reservation}`, title: x.reservation}, shortId(x.reservation)), ' ',
    pill(x.state), ' ', x.kind === 'gpu' ? 'whole GPU' : x.kind === 'mig' ? `MIG ${x.atoms}` : `share ${x.atoms}`,
    x.spot ? ' (spot)' : '', ' ', h('span', {class: 'muted'}, 'from '), time(x.from),
    h('span', {class: 'muted'}, x.until ? ' until ' : ' until released'), x.until ? time(x.until) : null)));
}

export async function renderNode(main, {params}) {
  const id = params[0];
  const head = h('div');
  const actions = h('div', {class: 'toolbar', role: 'group', 'aria-label': 'Node actions'});
  const result = h('div', {class: 'result'});
  const gpus = h('div');
  const res = h('div');
  const cmds = h('div');
  main.append(head, actions, result,
    section('GPUs', gpus), section('Reservations on this node', res), section('Commands', cmds));

  const load = async () => {
    const [n, devs] = await Promise.all([call('nodes.get', {node: id}), call('devices.list', {node: id})]);
    clear(head).append(h('h1', {}, 'Node ', n.name),
      h('dl', {class: 'facts'},
        h('dt', {}, 'State'), h('dd', {}, pill(n.state)),
        h('dt', {}, 'Session'), h('dd', {}, pill(n.status)),
        h('dt', {}, 'Health'), h('dd', {}, pill(n.health)),
        h('dt', {}, 'Last seen'), h('dd', {}, time(n.lastSeenAt)),
        h('dt', {}, 'Labels'), h('dd', {}, Object.entries(n.labels || {}).map(([k, v]) => `${k}=${v}`).join(', ') || '—'),
        h('dt', {}, 'Id'), h('dd', {}, h('code', {}, n.id))));
    clear(gpus).append(table(`GPUs of ${n.name}`, [
      {title: 'GPU', cell: (d) => String(d.index)},
      {title: 'Model', cell: (d) => d.name || d.model},
      {title: 'Mode', cell: (d) => (d.mode === 'timeslice' ? `time-slice (${d.shares} shares)` : d.mode === 'mig' ? 'MIG' : 'whole')},
      {title: 'Health', cell: (d) => pill(d.health)},
      {title: 'Holders', cell: holderList},
    ], devs, 'This node reported no GPU.'));
    return n;
  };
  const loadLists = async () => {
    const [rs, cs] = await Promise.all([
      listAll('reservations.list', {node: id}, {max: 500}),
      listAll('commands.list', {node: id}, {max: 500}),
    ]);
    const live = rs.filter((r) => r.state === 'active' || r.state === 'pending');
    clear(res).append(table('!Reservations on this node', [
      {title: 'Reservation', cell: (r) => h('a', {href: `#/reservations?focus=${r.id}`, title: r.id}, shortId(r.id))},
      {title: 'State', cell: (r) => pill(r.state)},
      {title: 'Starts', cell: (r) => time(r.startsAt)},
      {title: 'Ends', cell: (r) => (r.endsAt ? time(r.endsAt) : 'when released')},
    ], live, 'Nothing holds or will hold this node.'));
    clear(cmds).append(table('!Commands sent to this node', [
      {title: 'Kind', cell: (c) => c.kind},
      {title: 'State', cell: (c) => pill(c.state)},
      {title: 'Created', cell: (c) => time(c.createdAt)},
      {title: 'Result', cell: (c) => (c.error ? h('span', {class: 'bad'}, c.error) : c.result ? h('code', {}, JSON.stringify(c.result).slice(0, 120)) : '—')},
    ], cs.slice(-20).reverse(), 'No command yet.'));
  };

  let node;
  try {
    node = await load();
  } catch (err) {
    main.replaceChildren(errorBox(err));
    return undefined;
  }
  const act = async (method, verb, input, danger, explain) => {
    if (!(await confirmAction({title: `${verb} ${node.name}?`, body: h('p', {}, explain), confirm: verb, danger}))) return;
    const key = idempotencyKey();
    const n = await run(result, () => call(method, input, {idempotencyKey: key}), (x) => `${node.name} is now ${x.state}.`);
    if (n) node = await load().catch(() => node);
    await loadLists().catch(() => {});
  };
  const endNow = h('input', {type: 'checkbox', id: 'drain-end'});
  actions.append(
    h('button', {type: 'button', onclick: () => act('nodes.cordon', 'Cordon', {node: id}, false, 'No new reservation will be placed on it; what holds it now keeps it.')}, 'Cordon'),
    h('button', {type: 'button', onclick: () => act('nodes.uncordon', 'Uncordon', {node: id}, false, 'It takes new reservations again.')}, 'Uncordon'),
    h('button', {type: 'button', class: 'danger', onclick: () => act('nodes.drain', 'Drain', {node: id, end: endNow.checked}, true,
      endNow.checked ? 'No new reservation, and every reservation holding it now ends now.' : 'No new reservation; those holding it run out.')}, 'Drain'),
    h('label', {class: 'inline', for: 'drain-end'}, endNow, ' end its reservations now'));
  main.insertBefore(section('Send a command', commandForm({node: id, nodeName: node.name, onSent: () => loadLists()})), main.querySelector('section'));
  return poll(() => loadLists().catch((err) => clear(res).append(errorBox(err))), 3000);
}
