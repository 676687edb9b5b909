// FleetMap draws a fleet on a canvas: a tile per node, a cell per GPU, coloured by its state and
// its holder. Drawing is batched by colour (one path per colour, one fill each), so 80,000 GPUs
// are a few hundred fills. Pointer and keyboard select a GPU; Enter opens its node.

export const COLORS = {
  background: '#0d1117',
  free: '#8c959f',
  offline: '#57606a',
  unhealthy: '#ff7b72',
  degraded: '#e3b341',
  cordoned: '#f0883e',
  selection: '#ffffff',
  label: '#e6edf3',
};

const holderCache = new Map();

// holderColor gives each reservation a colour of its own, stable across reloads: a hue from a
// hash of its id, kept out of the reds and oranges that mean trouble.
export function holderColor(id) {
  let c = holderCache.get(id);
  if (c) return c;
  let x = 2166136261;
  for (let i = 0; i < id.length; i++) {
    x ^= id.charCodeAt(i);
    x = Math.imul(x, 16777619);
  }
  const hue = 70 + ((x >>> 0) % 230); // 70°..300°: yellow-green through blue to violet
  const light = 55 + ((x >>> 9) % 3) * 8;
  c = `hsl(${hue} 80% ${light}%)`;
  holderCache.set(id, c);
  return c;
}

// gpuState is what a GPU's cell shows: offline (its node is), unhealthy, held (whole), spot
// (held by spot holders only), partial (MIG slices or time-slice shares held), degraded, free.
export function gpuState(n, g) {
  if (n.status === 'offline') return 'offline';
  if (g.health === 'unhealthy') return 'unhealthy';
  if (g.held && (g.held >= 64 || g.mode === 'whole')) return g.spot ? 'spot' : 'held';
  if (g.held) return 'partial';
  if (g.health === 'degraded') return 'degraded';
  return 'free';
}

export const STATE_TEXT = {
  free: 'free',
  held: 'held',
  spot: 'held by spot',
  partial: 'partly held',
  unhealthy: 'unhealthy',
  degraded: 'degraded',
  offline: 'node offline',
};

export class FleetMap {
  constructor(canvas, {onSelect = () => {}, onOpen = () => {}} = {}) {
    this.canvas = canvas;
    this.ctx = canvas.getContext('2d', {alpha: false});
    this.nodes = [];
    this.sel = null; // {i, g}
    this.onSelect = onSelect;
    this.onOpen = onOpen;
    canvas.addEventListener('click', (e) => {
      const r = canvas.getBoundingClientRect();
      const hit = this.hit(e.clientX - r.left, e.clientY - r.top);
      if (hit) this.select(hit.i, hit.g);
    });
    canvas.addEventListener('dblclick', () => this.sel && this.onOpen(this.nodes[this.sel.i]));
    canvas.addEventListener('keydown', (e) => this.key(e));
  }

  // setNodes lays the map out for nodes and draws it; it answers how long each part took (ms).
  setNodes(nodes) {
    const t0 = performance.now();
    this.nodes = nodes;
    if (this.sel && (this.sel.i >= nodes.length)) this.sel = null;
    this.layout();
    const t1 = performance.now();
    this.draw();
    const t2 = performance.now();
    if (this.sel) {
      // Read out the selected GPU again only if what it shows changed.
      const n = this.nodes[this.sel.i];
      const g = n.gpus[Math.min(this.sel.g, n.gpus.length - 1)];
      const sig = JSON.stringify([n.id, n.state, n.status, g]);
      if (sig !== this.selSig) { this.selSig = sig; if (g) this.onSelect(n, g); }
    }
    return {layoutMs: t1 - t0, drawMs: t2 - t1};
  }

  layout() {
    const n = this.nodes.length;
    const width = Math.max(320, this.canvas.parentElement.clientWidth - 2);
    const cell = n <= 64 ? 24 : n <= 600 ? 14 : n <= 3000 ? 8 : 5;
    const gap = 1;
    const tileGap = cell >= 14 ? 10 : 3;
    const label = cell >= 14 ? 16 : 0;
    let gpus = 1;
    for (const x of this.nodes) gpus = Math.max(gpus, x.gpus.length);
    const tileW = gpus * (cell + gap) - gap;
    const tileH = cell + label;
    const cols = Math.max(1, Math.floor((width - tileGap) / (tileW + tileGap)));
    const rows = Math.ceil(n / cols);
    this.geo = {cell, gap, tileGap, label, tileW, tileH, cols, rows};
    const height = Math.max(cell + 2 * tileGap, tileGap + rows * (tileH + tileGap));
    const dpr = window.devicePixelRatio || 1;
    this.canvas.width = Math.round(width * dpr);
    this.canvas.height = Math.round(height * dpr);
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${height}px`;
    this.ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  }

  // tile answers where node i's tile starts.
  tile(i) {
    const {cols, tileW, tileH, tileGap} = this.geo;
    return {x: tileGap + (i % cols) * (tileW + tileGap), y: tileGap + Math.floor(i / cols) * (tileH + tileGap)};
  }

  // cellRect answers GPU g (its position in the node's list) of node i, in CSS pixels.
  cellRect(i, g) {
    const {cell, gap, label} = this.geo;
    const t = this.tile(i);
    return {x: t.x + g * (cell + gap), y: t.y + label, w: cell, h: cell};
  }

  draw() {
    const ctx = this.ctx;
    const {cell, label, tileW} = this.geo;
    ctx.fillStyle = COLORS.background;
    ctx.fillRect(0, 0, this.canvas.width, this.canvas.height);
    const paths = new Map();
    const path = (color) => {
      let p = paths.get(color);
      if (!p) paths.set(color, (p = new Path2D()));
      return p;
    };
    const outline = new Path2D();
    const marks = new Path2D();
    const frames = new Path2D();
    for (let i = 0; i < this.nodes.length; i++) {
      const n = this.nodes[i];
      if (n.state !== 'active') {
        const t = this.tile(i);
        frames.rect(t.x - 1.5, t.y + label - 1.5, tileW + 3, cell + 3);
      }
      for (let gi = 0; gi < n.gpus.length; gi++) {
        const g = n.gpus[gi];
        const r = this.cellRect(i, gi);
        switch (gpuState(n, g)) {
          case 'offline':
            outline.rect(r.x + 0.5, r.y + 0.5, r.w - 1, r.h - 1);
            break;
          case 'unhealthy':
            path(COLORS.unhealthy).rect(r.x, r.y, r.w, r.h);
            if (cell >= 8) {
              marks.moveTo(r.x + 2, r.y + 2); marks.lineTo(r.x + r.w - 2, r.y + r.h - 2);
              marks.moveTo(r.x + r.w - 2, r.y + 2); marks.lineTo(r.x + 2, r.y + r.h - 2);
            }
            break;
          case 'degraded':
            path(COLORS.degraded).rect(r.x, r.y, r.w, r.h);
            break;
          case 'held':
            path(holderColor(g.holders[0])).rect(r.x, r.y, r.w, r.h);
            break;
          case 'spot':
            path(holderColor(g.holders[0])).rect(r.x, r.y, r.w, r.h);
            marks.moveTo(r.x, r.y + r.h); marks.lineTo(r.x + r.w, r.y);
            break;
          case 'partial': {
            const part = Math.max(1, Math.round(r.h * Math.min(g.held, 64) / (g.mode === 'timeslice' && g.shares ? g.shares : 64)));
            path(COLORS.free).rect(r.x, r.y, r.w, r.h - part);
            path(holderColor(g.holders[0])).rect(r.x, r.y + r.h - part, r.w, part);
            break;
          }
          default:
            path(COLORS.free).rect(r.x, r.y, r.w, r.h);
        }
      }
    }
    for (const [color, p] of paths) {
      ctx.fillStyle = color;
      ctx.fill(p);
    }
    ctx.lineWidth = 1;
    ctx.strokeStyle = COLORS.offline;
    ctx.stroke(outline);
    ctx.strokeStyle = COLORS.background;
    ctx.lineWidth = cell >= 14 ? 2 : 1;
    ctx.stroke(marks);
    ctx.strokeStyle = COLORS.cordoned;
    ctx.lineWidth = 1.5;
    ctx.stroke(frames);
    if (label) {
      ctx.fillStyle = COLORS.label;
      ctx.font = '11px system-ui, sans-serif';
      ctx.textBaseline = 'top';
      for (let i = 0; i < this.nodes.length; i++) {
        const t = this.tile(i);
        ctx.fillText(this.nodes[i].name, t.x, t.y + 1, tileW);
      }
    }
    if (this.sel) {
      const r = this.cellRect(this.sel.i, this.sel.g);
      ctx.strokeStyle = COLORS.selection;
      ctx.lineWidth = 2;
      ctx.strokeRect(r.x - 2, r.y - 2, r.w + 4, r.h + 4);
    }
  }

  // hit answers the GPU under a point (CSS pixels from the canvas's corner), or null.
  hit(x, y) {
    if (!this.geo) return null;
    const {cols, tileW, tileH, tileGap, cell, gap, label} = this.geo;
    const col = Math.floor((x - tileGap) / (tileW + tileGap));
    const row = Math.floor((y - tileGap) / (tileH + tileGap));
    if (col < 0 || col >= cols || row < 0) return null;
    const i = row * cols + col;
    if (i >= this.nodes.length) return null;
    const t = this.tile(i);
    const g = Math.floor((x - t.x) / (cell + gap));
    if (g < 0 || g >= this.nodes[i].gpus.length || y < t.y + label || y > t.y + tileH) return null;
    return {i, g};
  }

  select(i, g) {
    if (i < 0 || i >= this.nodes.length) return;
    const n = this.nodes[i];
    g = Math.max(0, Math.min(g, n.gpus.length - 1));
    this.sel = {i, g};
    this.selSig = JSON.stringify([n.id, n.state, n.status, n.gpus[g]]);
    this.draw();
    const r = this.cellRect(i, g);
    const box = this.canvas.parentElement;
    if (r.y < box.scrollTop || r.y + r.h > box.scrollTop + box.clientHeight) box.scrollTop = r.y - box.clientHeight / 2;
    this.onSelect(n, n.gpus[g]);
  }

  key(e) {
    if (!this.nodes.length) return;
    const s = this.sel || {i: 0, g: 0};
    const cols = this.geo.cols;
    let {i, g} = s;
    switch (e.key) {
      case 'ArrowRight':
        if (this.sel) g++;
        if (g >= this.nodes[i].gpus.length) { i = Math.min(this.nodes.length - 1, i + 1); g = 0; }
        break;
      case 'ArrowLeft':
        g--;
        if (g < 0) { i = Math.max(0, i - 1); g = this.nodes[i].gpus.length - 1; }
        break;
      case 'ArrowDown': i = Math.min(this.nodes.length - 1, i + cols); break;
      case 'ArrowUp': i = Math.max(0, i - cols); break;
      case 'Home': i = 0; g = 0; break;
      case 'End': i = this.nodes.length - 1; g = 0; break;
      case 'Enter':
        if (this.sel) this.onOpen(this.nodes[this.sel.i]);
        e.preventDefault();
        return;
      default:
        return;
    }
    e.preventDefault();
    this.select(i, g);
  }

  // find selects the first GPU of the node whose name or id is q.
  find(q) {
    const i = this.nodes.findIndex((n) => n.name === q || n.id === q);
    if (i >= 0) this.select(i, 0);
    return i >= 0;
  }

  // cellCenter answers where a node's GPU is drawn, in the page's coordinates (for tests and
  // tools that drive the map as a person would).
  cellCenter(nodeId, index) {
    const i = this.nodes.findIndex((n) => n.id === nodeId || n.name === nodeId);
    if (i < 0) return null;
    const g = this.nodes[i].gpus.findIndex((x) => x.index === index);
    const r = this.cellRect(i, g);
    const c = this.canvas.getBoundingClientRect();
    return {x: c.left + r.x + r.w / 2, y: c.top + r.y + r.h / 2};
  }
}
