// Sign-in: an API key, checked by a call of the API before it is kept (in the browser's session
// storage, gone when the tab closes), or the host's session when the host offers one.

import * as api from '../api.js';
import {h, errorBox, field} from '../dom.js';

export async function render(main, {cfg, onSignedIn}) {
  const key = h('input', {type: 'password', id: 'api-key', name: 'api-key', autocomplete: 'off', required: true, spellcheck: 'false'});
  const out = h('div', {id: 'signin-result'});
  const kept = sessionStorage.getItem('bc.signin-error');
  if (kept) {
    sessionStorage.removeItem('bc.signin-error');
    out.append(errorBox(new api.ApiError(401, JSON.parse(kept))));
  }
  const form = h('form', {class: 'card signin', 'aria-labelledby': 'signin-title'},
    h('h1', {id: 'signin-title'}, `Sign in to ${cfg.title}`),
    h('p', {}, 'Paste an API key. It is kept in this tab only (session storage), and every call the console makes is decided by IAM with it.'),
    field('API key', key, 'Keys look like biam_key_…'),
    h('div', {class: 'actions'}, h('button', {type: 'submit', class: 'primary', id: 'signin-submit'}, 'Sign in')),
    out);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    out.replaceChildren();
    const cred = key.value.trim();
    api.setCredential(cred, 'key');
    try {
      await api.call('pools.list', {limit: 1});
    } catch (err) {
      api.signOut();
      out.append(errorBox(err));
      key.focus();
      return;
    }
    onSignedIn();
  });
  main.append(form);
  if (cfg.session) {
    main.append(h('section', {class: 'card signin', 'aria-labelledby': 'session-title'},
      h('h2', {id: 'session-title'}, 'Or use your session'),
      h('p', {}, 'This console can use the session you have with its host.'),
      cfg.signInUrl ? h('p', {}, h('a', {href: cfg.signInUrl}, 'Sign in to the host')) : null,
      h('button', {type: 'button', onclick: () => location.reload()}, 'Try my session again')));
  }
  key.focus();
}
