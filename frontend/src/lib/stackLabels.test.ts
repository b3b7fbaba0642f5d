import { labelTable } from "./stackLabels";

describe("labelTable", () => {
  it("labels body cells from their column's header, keeping labels set by hand", () => {
    document.body.innerHTML = `<table><thead><tr><th>Name</th><th colspan="2">Size</th><th><span>Actions</span></th></tr></thead>
      <tbody><tr><td>a</td><td>1</td><td>KiB</td><td data-label="">x</td></tr></tbody></table>`;
    const table = document.querySelector("table") as HTMLTableElement;
    labelTable(table);
    const labels = Array.from(table.tBodies[0].rows[0].cells).map((c) => c.getAttribute("data-label"));
    expect(labels).toEqual(["Name", "Size", "Size", ""]);
  });
});
