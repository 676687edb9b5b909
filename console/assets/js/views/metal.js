// Machines (the metal module) with their provisioning state and their ramdisk task's progress,
// and workflow runs with each step's progress.

import {listAll} from '../api.js';
import {h, clear, errorBox, table, pill, time, fmtBytes, shortId, poll} from '../dom.js';
import {virtualTable} from '../vlist.js';

function task(m) {
  const t = m.task;
  if (!t) return h('span', {class: 'muted'}, '—');
  const label = `${t.kind}: ${t.phase || 'not started'}${t.total ? `, ${fmtBytes(t.bytes)} of ${fmtBytes(t.total)}` : ''}`;
  return h('div', {},
    t.total ? h('progress', {value: String(t.bytes || 0), max: String(t.total), 'aria-label': label}) : null,
    ' ', label, t.error ? h('span', {class: 'bad'}, ` ${t.error}`) : null);
}

export async function renderMachines(main) {
  main.append(h('h1', {}, 'Machines'));
  const body = h('div');
  main.append(body);
  return poll(async () => {
    try {
      const ms = await listAll('machines.list', {}, {max: 5000});
      clear(body).append(table('!Machines', [
        {title: 'Name', cell: (m) => h('span', {title: m.id}, m.name)},
        {title: 'State', cell: (m) => pill(m.state)},
        {title: 'Power', cell: (m) => pill(m.power)},
        {title: 'BMC', cell: (m) => `${m.bmc.driver} ${m.bmc.address}`},
        {title: 'Image', cell: (m) => m.image || '—'},
        {title: 'Task', cell: task},
        {title: 'Node', cell: (m) => (m.nodeId ? h('a', {href: `#/node/${m.nodeId}`}, shortId(m.nodeId)) : '—')},
        {title: 'Seen', cell: (m) => time(m.seenAt)},
      ], ms, 'No machine yet: machines.create registers one by its BMC.'));
    } catch (e) {
      clear(body).append(errorBox(e));
    }
  }, 3000);
}

const STEP_MARK = {succeeded: '✓', running: '▶', waiting: '…', failed: '✗', cancelled: '–', pending: '○'};

function steps(run) {
  const done = run.steps.filter((s) => s.state === 'succeeded').length;
  return h('div', {class: 'steps'},
    h('progress', {value: String(done), max: String(run.steps.length || 1), 'aria-label': `${done} of ${run.steps.length} steps done`}),
    h('ol', {class: 'stepper'}, run.steps.map((s) => h('li', {class: `step ${s.state}`, title: s.error || s.note || ''},
      h('span', {'aria-hidden': 'true'}, STEP_MARK[s.state] || '·'), ' ', s.name, h('span', {class: 'visually-hidden'}, `: ${s.state}`),
      s.attempts > 1 ? h('span', {class: 'muted'}, ` (${s.attempts} attempts)`) : null,
      s.note && s.state !== 'succeeded' ? h('span', {class: 'muted'}, ` — ${s.note}`) : null,
      s.error ? h('span', {class: 'bad', title: s.error}, ` — ${s.error.length > 70 ? s.error.slice(0, 70) + '…' : s.error}`) : null))));
}

export async function renderWorkflows(main) {
  main.append(h('h1', {}, 'Workflows'));
  const err = h('div');
  const vt = virtualTable({
    caption: 'Workflow runs, newest first',
    rowHeight: 64,
    columns: [
      {title: 'Run', width: '1fr', cell: (r) => h('span', {title: r.id}, shortId(r.id))},
      {title: 'Workflow', width: '1.3fr', cell: (r) => r.workflow},
      {title: 'Subject', width: '1fr', cell: (r) => h('span', {title: r.subject}, shortId(r.subject))},
      {title: 'State', width: '1fr', cell: (r) => pill(r.state)},
      {title: 'Steps', width: '4fr', cell: steps},
      {title: 'Started', width: '1.2fr', cell: (r) => time(r.createdAt)},
    ],
    empty: 'No workflow has run yet.',
  });
  main.append(err, vt.el);
  return poll(async () => {
    try {
      vt.setRows(await listAll('workflows.list', {}, {max: 5000}));
      clear(err);
    } catch (e) {
      clear(err).append(errorBox(e));
    }
  }, 3000);
}
