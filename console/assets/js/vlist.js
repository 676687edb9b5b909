// virtualTable is a table of any number of rows of which only those in view (and a few around
// them) are in the document: 10,000 nodes cost what 30 do. It keeps the table's semantics
// (role table, aria-rowcount, aria-rowindex on each row) so that assistive technology knows
// how many rows there are and where each one sits.

import {h, clear} from './dom.js';

export function virtualTable({caption, columns, rows = [], rowHeight = 36, height = '60vh', empty = 'Nothing to show.'}) {
  const template = columns.map((c) => c.width || '1fr').join(' ');
  const head = h('div', {role: 'row', class: 'vrow vhead', 'aria-rowindex': '1', style: `grid-template-columns:${template}`},
    columns.map((c) => h('div', {role: 'columnheader'}, c.title)));
  const spacer = h('div', {class: 'vspacer'});
  const body = h('div', {class: 'vbody', role: 'rowgroup', tabindex: '0', 'aria-label': `${caption}: scroll for more`, style: `max-height:${height}`}, spacer);
  const note = h('p', {class: 'muted vempty', hidden: true}, empty);
  const el = h('div', {class: 'vtable', role: 'table', 'aria-label': caption},
    h('div', {role: 'rowgroup'}, head), body, note);
  let data = rows;
  let drawn = '';

  function draw(force) {
    const top = body.scrollTop;
    const view = body.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / rowHeight) - 5);
    const last = Math.min(data.length, Math.ceil((top + view) / rowHeight) + 5);
    const sig = `${first}:${last}:${data.length}`;
    if (sig === drawn && !force) return;
    drawn = sig;
    const out = [];
    for (let i = first; i < last; i++) {
      const r = data[i];
      out.push(h('div', {role: 'row', class: 'vrow', 'aria-rowindex': String(i + 2),
        style: `top:${i * rowHeight}px;height:${rowHeight}px;grid-template-columns:${template}`},
      columns.map((c) => h('div', {role: 'cell'}, c.cell(r)))));
    }
    clear(spacer).append(...out);
  }

  let sig = null;
  function setRows(next) {
    // Rows redrawn with the same data would take the keyboard's focus away from a person.
    // (Compared only for lists small enough to compare quickly; a long one is redrawn.)
    if (next === data && sig !== null) return;
    const nextSig = next.length <= 5000 ? JSON.stringify(next) : null;
    if (nextSig !== null && nextSig === sig) return;
    sig = nextSig;
    data = next;
    el.setAttribute('aria-rowcount', String(data.length + 1));
    spacer.style.height = `${data.length * rowHeight}px`;
    note.hidden = data.length > 0;
    draw(true);
  }

  let pending = false;
  body.addEventListener('scroll', () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; draw(false); });
  });
  setRows(rows);
  // The first draw may happen before the table is in the document (no height yet).
  requestAnimationFrame(() => draw(true));
  return {el, setRows, rowCount: () => data.length};
}
