// On phones the console's tables stack as cards (styles.css, max-width 640px) and each cell
// shows its column's name from `data-label`. Rather than every table repeating its headers,
// the labels are copied from the header row here, for every table on the page as it renders.

/** Set `data-label` on each body cell of `table` from the header cell of its column (cells that
 * have one keep it). Spanning header cells are honoured; hidden header text counts. */
export function labelTable(table: HTMLTableElement): void {
  const head = table.tHead?.rows[0];
  if (!head) return;
  const names: string[] = [];
  for (const th of Array.from(head.cells)) {
    const text = (th.textContent ?? "").trim();
    for (let i = 0; i < th.colSpan; i++) names.push(text);
  }
  for (const body of Array.from(table.tBodies)) {
    for (const row of Array.from(body.rows)) {
      let col = 0;
      for (const cell of Array.from(row.cells)) {
        if (!cell.hasAttribute("data-label")) cell.setAttribute("data-label", names[col] ?? "");
        col += cell.colSpan;
      }
    }
  }
}

export function labelTables(root: ParentNode): void {
  root.querySelectorAll("table").forEach((t) => labelTable(t as HTMLTableElement));
}

/** Keep every table under `root` labelled as React adds and changes rows. */
export function watchTables(root: HTMLElement): () => void {
  let queued = false;
  const observer = new MutationObserver(() => {
    if (queued) return;
    queued = true;
    queueMicrotask(() => {
      queued = false;
      labelTables(root);
    });
  });
  observer.observe(root, { childList: true, subtree: true });
  labelTables(root);
  return () => observer.disconnect();
}
