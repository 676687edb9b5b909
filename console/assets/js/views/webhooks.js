// Webhooks: the tenant's endpoints, a new one (its signing secret shown once), a test event, the
// deliveries of each with their attempts, redelivery, and deletion, each after a confirmation.

import {call, listAll, idempotencyKey} from '../api.js';
import {h, clear, errorBox, field, table, pill, time, shortId, confirmAction, run, section} from '../dom.js';

export async function render(main) {
  main.append(h('h1', {}, 'Webhooks'));
  const url = h('input', {id: 'wh-url', type: 'url', required: true, placeholder: 'https://hooks.example.com/compute'});
  const types = h('input', {id: 'wh-types', type: 'text', placeholder: 'all; or node., reservation.preempted'});
  const desc = h('input', {id: 'wh-desc', type: 'text'});
  const out = h('div', {class: 'result', id: 'wh-result'});
  const form = h('form', {class: 'card form', 'aria-label': 'Add a webhook'},
    h('div', {class: 'grid'}, field('URL', url), field('Event types', types, 'Comma-separated types or prefixes ending in "."'), field('Description', desc)),
    h('div', {class: 'actions'}, h('button', {type: 'submit', class: 'primary'}, 'Add…')), out);
  const listEl = h('div');
  const deliveries = h('div', {id: 'wh-deliveries'});
  main.append(section('Add a webhook', form), section('Endpoints', listEl), deliveries);

  const showDeliveries = async (w) => {
    clear(deliveries).append(h('p', {class: 'muted'}, 'Reading deliveries…'));
    try {
      const ds = await listAll('webhooks.deliveries', {webhook: w.id}, {max: 500});
      clear(deliveries).append(section(`Deliveries to ${w.url}`, table('!Deliveries', [
        {title: 'Event', cell: (d) => `#${d.eventId} ${d.eventType}`},
        {title: 'State', cell: (d) => pill(d.state)},
        {title: 'Attempts', cell: (d) => String(d.attempts)},
        {title: 'Last attempt', cell: (d) => (d.lastAttempts[0] ? `${d.lastAttempts[0].status || d.lastAttempts[0].error || ''}` : '—')},
        {title: 'Next', cell: (d) => time(d.nextAttemptAt)},
        {title: '', cell: (d) => h('button', {type: 'button', class: 'small', onclick: async () => {
          if (!(await confirmAction({title: 'Deliver again?', body: h('p', {}, `Event #${d.eventId} is sent to ${w.url} again, now.`), confirm: 'Redeliver'}))) return;
          await run(deliveries, () => call('webhooks.redeliver', {delivery: d.id}, {idempotencyKey: idempotencyKey()}), 'Queued again.');
        }}, 'Redeliver')},
      ], ds, 'No delivery yet.')));
    } catch (e) {
      clear(deliveries).append(errorBox(e));
    }
  };
  const refresh = async () => {
    try {
      const ws = await listAll('webhooks.list', {});
      clear(listEl).append(table('!Webhook endpoints', [
        {title: 'URL', cell: (w) => h('span', {title: w.id}, w.url)},
        {title: 'Events', cell: (w) => (w.eventTypes.length ? w.eventTypes.join(', ') : 'all')},
        {title: 'Description', cell: (w) => w.description || '—'},
        {title: 'Created', cell: (w) => time(w.createdAt)},
        {title: 'Actions', cell: (w) => h('div', {class: 'row-actions'},
          h('button', {type: 'button', class: 'small', onclick: () => showDeliveries(w)}, 'Deliveries'),
          h('button', {type: 'button', class: 'small', onclick: async () => {
            if (!(await confirmAction({title: 'Send a test event?', body: h('p', {}, `A webhook.test event goes to ${w.url} alone.`), confirm: 'Send'}))) return;
            await run(out, () => call('webhooks.test', {webhook: w.id}, {idempotencyKey: idempotencyKey()}), 'Test event written; it is delivered within seconds.');
          }}, 'Test'),
          h('button', {type: 'button', class: 'small danger', onclick: async () => {
            if (!(await confirmAction({title: `Delete the webhook ${shortId(w.id)}?`, danger: true, confirm: 'Delete', body: h('p', {}, `${w.url} gets no more events; its deliveries are dropped.`)}))) return;
            if (await run(out, () => call('webhooks.delete', {webhook: w.id}, {idempotencyKey: idempotencyKey()}), 'Deleted.')) refresh();
          }}, 'Delete'))},
      ], ws, 'No webhook yet.'));
    } catch (e) {
      clear(listEl).append(errorBox(e));
    }
  };
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const input = {url: url.value.trim(), ...(desc.value.trim() ? {description: desc.value.trim()} : {}),
      ...(types.value.trim() ? {eventTypes: types.value.split(',').map((x) => x.trim()).filter(Boolean)} : {})};
    if (!(await confirmAction({title: 'Add this webhook?', body: h('p', {}, `Events ${input.eventTypes ? `of ${input.eventTypes.join(', ')}` : 'of every type'} are POSTed, signed, to ${input.url}.`), confirm: 'Add'}))) return;
    const w = await run(out, () => call('webhooks.create', input, {idempotencyKey: idempotencyKey()}), (x) =>
      h('span', {}, 'Added. Its signing secret, shown this once: ', h('code', {class: 'secret'}, x.secret)));
    if (w) refresh();
  });
  await refresh();
}
