// The console's shell: configuration, sign-in, navigation and the router. Views live in
// views/; each renders into <main> and answers a function that stops what it started.

import * as api from './api.js';
import {h, clear, errorBox, announce} from './dom.js';
import {forget} from './store.js';
import * as signin from './views/signin.js';
import * as pools from './views/pools.js';
import * as nodes from './views/nodes.js';
import * as fleet from './views/fleet.js';
import * as reservations from './views/reservations.js';
import * as commands from './views/commands.js';
import * as events from './views/events.js';
import * as webhooks from './views/webhooks.js';
import * as metal from './views/metal.js';

// The views in the navigation, in order. needs: a method that must be served for the view to be
// offered (the metal module's, say).
const VIEWS = [
  {path: 'pools', title: 'Pools', view: pools.render},
  {path: 'fleet', title: 'Fleet map', view: fleet.render},
  {path: 'nodes', title: 'Nodes', view: nodes.renderList},
  {path: 'reservations', title: 'Reservations', view: reservations.render},
  {path: 'commands', title: 'Commands', view: commands.render},
  {path: 'events', title: 'Events', view: events.render},
  {path: 'webhooks', title: 'Webhooks', view: webhooks.render},
  {path: 'machines', title: 'Machines', view: metal.renderMachines, needs: 'machines.list'},
  {path: 'workflows', title: 'Workflows', view: metal.renderWorkflows},
];

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
let cfg = {title: 'Better Compute', session: false};
let served = new Set();
let stop = null;
let renders = 0;

function route() {
  const hash = location.hash.replace(/^#\/?/, '');
  const [path, ...rest] = hash.split('/');
  const [name, query] = (path || '').split('?');
  return {name: name || 'pools', params: rest.map(decodeURIComponent), query: new URLSearchParams(query || '')};
}

export function navigate(to) {
  location.hash = '#/' + to;
}

async function render() {
  if (stop) { try { stop(); } catch { /* already stopped */ } stop = null; }
  const r = route();
  if (!api.credential()) {
    nav.hidden = true;
    clear(who);
    document.title = `Sign in · ${cfg.title}`;
    renders++;
    stop = await signin.render(clear(main), {cfg, onSignedIn: start});
    return;
  }
  let v = VIEWS.find((x) => x.path === r.name);
  if (r.name === 'node') v = {path: 'nodes', title: 'Node', view: nodes.renderNode};
  if (!v) v = VIEWS[0];
  for (const a of nav.querySelectorAll('a')) {
    if (a.dataset.path === v.path) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  document.title = `${v.title} · ${cfg.title}`;
  // Each render draws into a root of its own: one that a later render overtook draws into a
  // detached root, and its timers are stopped at once.
  const mine = ++renders;
  const root = h('div', {class: 'view'});
  main.replaceChildren(root);
  let stopper = null;
  try {
    stopper = (await v.view(root, {params: r.params, query: r.query, navigate, served})) || null;
  } catch (err) {
    root.append(errorBox(err));
    if (err instanceof api.ApiError && err.code === 'unauthenticated') signOutWith(err);
  }
  if (mine !== renders) {
    if (stopper) stopper();
    return;
  }
  stop = stopper;
  announce(`${v.title} view`);
}

function signOutWith(err) {
  api.signOut();
  forget();
  sessionStorage.setItem('bc.signin-error', JSON.stringify({code: err.code, message: err.message}));
  render();
}

async function start() {
  try {
    served = new Set((await api.methods()).map((m) => `${m.group}.${m.name}`));
  } catch {
    served = new Set();
  }
  clear(nav).append(h('ul', {}, VIEWS.filter((v) => !v.needs || served.has(v.needs)).map((v) =>
    h('li', {}, h('a', {href: `#/${v.path}`, dataset: {path: v.path}}, v.title)))));
  nav.hidden = false;
  clear(who).append(
    h('span', {class: 'muted'}, api.signedInWith() === 'session' ? 'Signed in with your session' : 'Signed in with an API key'),
    h('button', {type: 'button', class: 'link', onclick: () => { api.signOut(); forget(); location.hash = '#/'; render(); }}, 'Sign out'));
  if (!location.hash || location.hash === '#/' || location.hash.startsWith('#/signin')) {
    location.hash = '#/pools'; // hashchange renders it
    return;
  }
  await render();
}

async function boot() {
  try {
    const res = await fetch('config.json');
    cfg = {...cfg, ...(await res.json())};
  } catch { /* the defaults */ }
  api.configure(cfg);
  document.getElementById('brand').textContent = cfg.title;
  document.getElementById('skip').addEventListener('click', (e) => {
    e.preventDefault();
    main.focus();
  });
  window.addEventListener('hashchange', () => {
    if (location.hash.startsWith('#/') || location.hash === '') render();
  });
  // A host session signs the person in without a key.
  if (!api.credential() && cfg.session) {
    try {
      const res = await fetch('session', {method: 'POST', headers: {'X-Better-Compute-Console': '1'}});
      const body = await res.json();
      if (res.ok && body.credential) api.setCredential(body.credential, 'session');
    } catch { /* then a key */ }
  }
  if (api.credential()) await start();
  else await render();
}

window.bcConsole = window.bcConsole || {};
boot();
