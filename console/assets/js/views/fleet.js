// The fleet map: every node a tile, every GPU a cell coloured by its state and its holder,
// drawn on a canvas. A GPU is selected by pointer, by the arrow keys or by finding its node;
// its details (and its holders) are read out beside the map.

import {h, clear, errorBox, field, shortId} from '../dom.js';
import {loadFleet, loadPools} from '../store.js';
import {FleetMap, gpuState, holderColor, COLORS, STATE_TEXT} from '../fleetmap.js';

function legend() {
  const item = (label, style) => h('li', {}, h('span', {class: 'swatch', style, 'aria-hidden': 'true'}), label);
  return h('ul', {class: 'legend', id: 'fleet-legend', 'aria-label': 'Legend'},
    item('free', `background:${COLORS.free}`),
    item('held: a colour per reservation', `background:linear-gradient(90deg, ${holderColor('a')}, ${holderColor('b')}, ${holderColor('c')})`),
    item('held by spot: a stripe across', `background:linear-gradient(135deg, ${holderColor('a')} 45%, ${COLORS.background} 45% 55%, ${holderColor('a')} 55%)`),
    item('partly held (MIG slices, time-slice shares): filled from the bottom', `background:linear-gradient(0deg, ${holderColor('b')} 50%, ${COLORS.free} 50%)`),
    item('unhealthy GPU: red, crossed', `background:${COLORS.unhealthy}`),
    item('degraded GPU', `background:${COLORS.degraded}`),
    item('node offline: outlined', `border:1px solid ${COLORS.offline};background:${COLORS.background}`),
    item('node cordoned or draining: framed in orange', `border:2px solid ${COLORS.cordoned};background:${COLORS.free}`));
}

function summary(nodes) {
  const c = {free: 0, held: 0, spot: 0, partial: 0, unhealthy: 0, degraded: 0, offline: 0};
  let gpus = 0;
  for (const n of nodes) {
    for (const g of n.gpus) {
      c[gpuState(n, g)]++;
      gpus++;
    }
  }
  return `${nodes.length.toLocaleString('en')} nodes, ${gpus.toLocaleString('en')} GPUs: ` +
    Object.entries(c).filter(([, v]) => v).map(([k, v]) => `${v.toLocaleString('en')} ${STATE_TEXT[k]}`).join(', ');
}

export async function render(main, {navigate, query}) {
  const poolSel = h('select', {id: 'fleet-pool'}, h('option', {value: ''}, 'All pools'));
  const find = h('input', {type: 'search', id: 'fleet-find', placeholder: 'node name'});
  const findForm = h('form', {class: 'inline-form', role: 'search', 'aria-label': 'Find a node on the map'}, field('Find node', find), h('button', {type: 'submit'}, 'Find'));
  const refreshBtn = h('button', {type: 'button', id: 'fleet-refresh'}, 'Refresh');
  const sum = h('p', {id: 'fleet-summary'});
  const timing = h('p', {id: 'fleet-timing', class: 'muted'});
  const detail = h('div', {id: 'fleet-detail', class: 'card detail', 'aria-live': 'polite'}, h('p', {class: 'muted'}, 'Select a GPU: click it, or focus the map and use the arrow keys.'));
  const canvas = h('canvas', {id: 'fleet-canvas', tabindex: '0', role: 'application', 'aria-roledescription': 'fleet map',
    'aria-label': 'Fleet map. Arrow keys move between GPUs, Enter opens the node.', 'aria-describedby': 'fleet-summary fleet-legend'});
  const box = h('div', {class: 'mapbox'}, canvas);
  const err = h('div');
  main.append(h('h1', {}, 'Fleet map'),
    h('div', {class: 'toolbar'}, field('Pool', poolSel), findForm, refreshBtn),
    err, sum, h('div', {class: 'maplayout'}, box, h('aside', {'aria-label': 'Selected GPU'}, detail, legend())), timing);

  const map = new FleetMap(canvas, {
    onSelect: (n, g) => {
      const state = gpuState(n, g);
      clear(detail).append(
        h('h2', {}, h('a', {href: `#/node/${n.id}`}, n.name), `, GPU ${g.index}`),
        h('dl', {class: 'facts'},
          h('dt', {}, 'State'), h('dd', {id: 'fleet-detail-state'}, STATE_TEXT[state]),
          h('dt', {}, 'Model'), h('dd', {}, g.model),
          h('dt', {}, 'Mode'), h('dd', {}, g.mode === 'timeslice' ? `time-slice, ${g.shares} shares` : g.mode),
          h('dt', {}, 'Health'), h('dd', {}, g.health),
          h('dt', {}, 'Node'), h('dd', {}, `${n.state}, ${n.status}, ${n.health}`),
          h('dt', {}, 'Held'), h('dd', {}, g.held ? `${g.held} of 64 atoms${g.spot ? ', spot' : ''}` : 'nothing'),
          h('dt', {}, 'Holders'), h('dd', {id: 'fleet-detail-holders'}, g.holders && g.holders.length
            ? h('ul', {class: 'plain'}, g.holders.map((id) => h('li', {}, h('span', {class: 'swatch', style: `background:${holderColor(id)}`, 'aria-hidden': 'true'}),
              h('a', {href: `#/reservations?focus=${id}`, title: id, dataset: {reservation: id}}, `reservation ${shortId(id)}`))))
            : 'none')));
    },
    onOpen: (n) => navigate(`node/${n.id}`),
  });
  window.bcConsole.fleetMap = map;

  let all = [];
  const draw = () => {
    const nodes = poolSel.value ? all.filter((n) => n.poolId === poolSel.value) : all;
    const t = map.setNodes(nodes);
    sum.textContent = summary(nodes);
    // The paint itself happens after this frame's script: measured to the next frame.
    const t0 = performance.now() - t.layoutMs - t.drawMs;
    requestAnimationFrame(() => requestAnimationFrame(() => {
      const painted = performance.now() - t0;
      window.bcConsole.fleetTiming = {...window.bcConsole.fleetTiming, nodes: nodes.length, layoutMs: t.layoutMs, drawMs: t.drawMs, paintedMs: painted};
      timing.textContent = `Read ${all.length.toLocaleString('en')} nodes in ${Math.round(window.bcConsole.fleetTiming.fetchMs)} ms; ` +
        `drew ${nodes.length.toLocaleString('en')} in ${Math.round(t.layoutMs + t.drawMs)} ms (${Math.round(painted)} ms to the screen).`;
      timing.dataset.ready = 'true';
    }));
  };
  const load = async () => {
    timing.dataset.ready = 'false';
    try {
      const f = await loadFleet();
      all = f.nodes;
      window.bcConsole.fleetTiming = {fetchMs: f.fetchMs};
      clear(err);
      draw();
    } catch (e) {
      clear(err).append(errorBox(e));
    }
  };
  loadPools().then((ps) => poolSel.append(...ps.map((p) => h('option', {value: p.id, selected: query.get('pool') === p.name}, p.name)))).catch(() => {});
  poolSel.addEventListener('change', draw);
  refreshBtn.addEventListener('click', load);
  findForm.addEventListener('submit', (e) => {
    e.preventDefault();
    if (!map.find(find.value.trim())) clear(detail).append(h('p', {role: 'alert'}, `No node named ${find.value.trim()} on this map.`));
    else canvas.focus();
  });
  let width = box.clientWidth;
  const onResize = () => {
    if (box.clientWidth !== width && all.length) {
      width = box.clientWidth;
      draw();
    }
  };
  window.addEventListener('resize', onResize);
  await load();
  // A small fleet is read again every 5 s; a large one when asked (Refresh).
  const timer = setInterval(() => { if (all.length <= 2000 && document.visibilityState === 'visible') load(); }, 5000);
  return () => { clearInterval(timer); window.removeEventListener('resize', onResize); };
}
