// Commands: one-shot work for a node's bcd (health.check, gpu.reset, …), sent after a
// confirmation, and their states and results, refreshed while any is still running.

import {call, listAll, idempotencyKey} from '../api.js';
import {h, clear, errorBox, field, pill, time, shortId, confirmAction, run, poll, section} from '../dom.js';
import {loadFleet} from '../store.js';
import {virtualTable} from '../vlist.js';

const KINDS = {
  'health.check': '{}',
  'inventory.refresh': '{}',
  'gpu.reset': '{"gpu": 0}',
  'diag.run': '{"test": "memory", "seconds": 10}',
};

// commandForm is the form that sends a command: to the node given, or to one chosen.
export function commandForm({node = '', nodeName = '', onSent = () => {}} = {}) {
  const nodeSel = h('select', {id: 'cmd-node', required: true});
  if (node) nodeSel.append(h('option', {value: node, selected: true}, nodeName || node));
  else loadFleet({fresh: false}).then((f) => nodeSel.append(...f.nodes.slice(0, 5000).map((n) => h('option', {value: n.id}, n.name)))).catch(() => {});
  const kind = h('select', {id: 'cmd-kind'}, Object.keys(KINDS).map((k) => h('option', {value: k}, k)));
  const args = h('textarea', {id: 'cmd-args', rows: '2', spellcheck: 'false'});
  args.value = KINDS[kind.value];
  kind.addEventListener('change', () => { args.value = KINDS[kind.value]; });
  const deadline = h('input', {id: 'cmd-deadline', type: 'text', placeholder: '5m', size: '6'});
  const out = h('div', {class: 'result'});
  const form = h('form', {class: 'card form', 'aria-label': 'Send a command'},
    h('div', {class: 'grid wide'},
      node ? null : field('Node', nodeSel),
      field('Kind', kind),
      field('Arguments (JSON)', args, 'gpu.reset takes {"gpu": index}; diag.run {"test", "seconds"}'),
      field('Deadline', deadline, 'From now; default 5m')),
    h('div', {class: 'actions'}, h('button', {type: 'submit', class: 'primary'}, 'Send…')),
    out);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    let parsed;
    try {
      parsed = args.value.trim() ? JSON.parse(args.value) : undefined;
    } catch (err) {
      clear(out).append(errorBox(new Error(`The arguments are not JSON: ${err.message}`)));
      return;
    }
    const target = nodeSel.value;
    const label = nodeSel.selectedOptions[0] ? nodeSel.selectedOptions[0].textContent : target;
    const ok = await confirmAction({title: `Send ${kind.value} to ${label}?`,
      body: h('p', {}, `bcd on ${label} carries out ${kind.value}`, parsed ? ` with ${JSON.stringify(parsed)}` : '', '.'), confirm: 'Send'});
    if (!ok) return;
    const input = {node: target, kind: kind.value, ...(parsed ? {args: parsed} : {}), ...(deadline.value.trim() ? {deadline: deadline.value.trim()} : {})};
    const key = idempotencyKey();
    const c = await run(out, () => call('commands.create', input, {idempotencyKey: key}), (x) => `Command ${shortId(x.id)} (${x.kind}) is ${x.state}.`);
    if (c) onSent(c);
  });
  return form;
}

function result(c) {
  if (c.error) return h('span', {class: 'bad'}, c.error);
  if (!c.result) return h('span', {class: 'muted'}, '—');
  const text = JSON.stringify(c.result);
  return text.length < 60 ? h('code', {}, text) : h('details', {}, h('summary', {}, h('code', {}, text.slice(0, 50) + '…')), h('pre', {}, JSON.stringify(c.result, null, 2)));
}

export async function render(main) {
  main.append(h('h1', {}, 'Commands'));
  const fleet = await loadFleet({fresh: false}).catch(() => ({byId: new Map()}));
  const vt = virtualTable({
    caption: 'Commands, newest first',
    rowHeight: 44,
    columns: [
      {title: 'Command', width: '1fr', cell: (c) => h('span', {title: c.id}, shortId(c.id))},
      {title: 'Node', width: '1.4fr', cell: (c) => h('a', {href: `#/node/${c.nodeId}`}, (fleet.byId.get(c.nodeId) || {}).name || shortId(c.nodeId))},
      {title: 'Kind', width: '1.2fr', cell: (c) => c.kind},
      {title: 'State', width: '1fr', cell: (c) => pill(c.state)},
      {title: 'Created', width: '1.3fr', cell: (c) => time(c.createdAt)},
      {title: 'Result', width: '3fr', cell: result},
    ],
    empty: 'No command yet.',
  });
  const err = h('div');
  main.append(section('Send a command', commandForm({onSent: () => refresh()})), section('Sent', err, vt.el));
  const refresh = async () => {
    try {
      const all = await listAll('commands.list', {}, {max: 20000});
      vt.setRows(all.reverse());
      clear(err);
    } catch (e) {
      clear(err).append(errorBox(e));
    }
  };
  return poll(refresh, 2000);
}
