// Pools and their capacity now: whole GPUs per model (capacity.summary, from the rollups), and
// the GPUs in MIG or time-slice mode with how much of them is held (from the fleet map).

import {call} from '../api.js';
import {h, errorBox, section, table} from '../dom.js';
import {loadFleet, loadPools} from '../store.js';

function bar(c) {
  const pct = (x) => (c.total ? (100 * x) / c.total : 0);
  return h('div', {class: 'bar', role: 'img', 'aria-label': `${c.used} used, ${c.spot} spot, ${c.free} free of ${c.total}`},
    h('span', {class: 'used', style: `width:${pct(c.used)}%`}),
    h('span', {class: 'spot', style: `width:${pct(c.spot)}%`}));
}

// partitioned counts, per pool and model, the GPUs in MIG and time-slice mode and what of them
// is held now: MIG in memory slices (8 a GPU), time-slices in shares.
function partitioned(nodes) {
  const out = new Map();
  for (const n of nodes) {
    for (const g of n.gpus) {
      if (g.mode === 'whole') continue;
      const k = `${n.poolId}|${g.model}|${g.mode}`;
      let row = out.get(k);
      if (!row) out.set(k, (row = {pool: n.poolId, model: g.model, mode: g.mode, gpus: 0, units: 0, held: 0}));
      row.gpus++;
      if (g.mode === 'mig') {
        row.units += 8;
        row.held += Math.ceil((g.held || 0) / 8);
      } else {
        row.units += g.shares;
        row.held += g.held || 0;
      }
    }
  }
  return [...out.values()];
}

export async function render(main) {
  main.append(h('h1', {}, 'Pools'));
  const pools = await loadPools({fresh: true});
  if (!pools.length) {
    main.append(h('p', {class: 'muted'}, 'No pools yet: create one with pools.create, then join nodes to it.'));
    return;
  }
  const list = h('div', {class: 'pools'});
  main.append(list);
  const summaries = await Promise.all(pools.map((p) => call('capacity.summary', {pool: p.id}).catch((e) => e)));
  pools.forEach((p, i) => {
    const s = summaries[i];
    const body = s instanceof Error ? errorBox(s) : [
      h('p', {}, `${s.nodes} nodes, ${s.schedulable} schedulable`),
      table(`Whole GPUs of ${p.name} by model`, [
        {title: 'Model', cell: (m) => m.model},
        {title: 'Total', cell: (m) => String(m.total)},
        {title: 'Used', cell: (m) => String(m.used)},
        {title: 'Spot', cell: (m) => String(m.spot)},
        {title: 'Free', cell: (m) => h('strong', {}, String(m.free))},
        {title: 'Use', cell: (m) => bar(m)},
      ], s.models, 'No GPUs in whole mode.'),
      h('p', {class: 'muted'}, `vCPUs: ${s.vcpus.free} free of ${s.vcpus.total} · memory: ${s.memoryGiB.free} GiB free of ${s.memoryGiB.total} GiB`),
      h('div', {class: 'partitioned', dataset: {pool: p.id}}, h('p', {class: 'muted'}, 'Reading MIG and time-slice GPUs…')),
    ];
    list.append(h('article', {class: 'card pool', 'aria-labelledby': `pool-${p.id}`, dataset: {pool: p.name}},
      h('h2', {id: `pool-${p.id}`}, p.displayName || p.name, ' ', h('span', {class: 'muted'}, p.name !== (p.displayName || p.name) ? p.name : '')),
      p.description ? h('p', {}, p.description) : null,
      body));
  });
  try {
    const fleet = await loadFleet();
    const rows = partitioned(fleet.nodes);
    for (const slot of list.querySelectorAll('.partitioned')) {
      const mine = rows.filter((r) => r.pool === slot.dataset.pool);
      slot.replaceChildren(section('MIG and time-slices',
        table('!MIG and time-sliced GPUs', [
          {title: 'Model', cell: (r) => r.model},
          {title: 'Mode', cell: (r) => (r.mode === 'mig' ? 'MIG' : 'time-slice')},
          {title: 'GPUs', cell: (r) => String(r.gpus)},
          {title: 'Held', cell: (r) => `${r.held} of ${r.units} ${r.mode === 'mig' ? 'memory slices' : 'shares'}`},
          {title: 'Free', cell: (r) => h('strong', {}, String(r.units - r.held))},
        ], mine, 'No GPU of this pool is in MIG or time-slice mode.')));
    }
  } catch (err) {
    for (const slot of list.querySelectorAll('.partitioned')) slot.replaceChildren(errorBox(err));
  }
}
