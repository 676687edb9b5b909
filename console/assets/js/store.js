// Shared reads several views need: the whole fleet map (devices.map, read in pages of 5,000
// nodes) and the pools. Each view asks again when it opens; a read in flight is shared.

import {call, listAll} from './api.js';

let fleet = null;
let inflight = null;

// loadFleet answers every node of the caller's tenant with its GPUs now, and how long the read
// took. fresh: read again even if a read is recent.
export function loadFleet({fresh = true} = {}) {
  if (inflight) return inflight;
  if (fleet && !fresh) return Promise.resolve(fleet);
  const t0 = performance.now();
  inflight = (async () => {
    try {
      const nodes = [];
      let cursor = '';
      for (;;) {
        const page = await call('devices.map', {limit: 5000, ...(cursor ? {cursor} : {})});
        for (const n of page.items) nodes.push(n);
        if (!page.nextCursor) break;
        cursor = page.nextCursor;
      }
      fleet = {nodes, byId: new Map(nodes.map((n) => [n.id, n])), loadedAt: new Date(), fetchMs: performance.now() - t0};
      return fleet;
    } finally {
      inflight = null;
    }
  })();
  return inflight;
}

let poolsCache = null;

export async function loadPools({fresh = false} = {}) {
  if (!poolsCache || fresh) poolsCache = await listAll('pools.list', {});
  return poolsCache;
}

export function forget() {
  fleet = null;
  poolsCache = null;
}

// gpuCounts counts a node's GPUs: total, whole ones free and held, and the partitioned.
export function gpuCounts(n) {
  const c = {total: n.gpus.length, free: 0, held: 0};
  for (const g of n.gpus) {
    if (g.held) c.held++;
    else if (g.health !== 'unhealthy') c.free++;
  }
  return c;
}
