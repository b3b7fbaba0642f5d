import { fireEvent, render, screen } from "@testing-library/react";
import { describe, expect, it, vi } from "vitest";
import { acceptable, FileDrop } from "./FileDrop";

describe("FileDrop", () => {
  it("accepts .py and .zip only", () => {
    expect(acceptable(new File(["x"], "lip.py"))).toBe(true);
    expect(acceptable(new File(["x"], "LIP.ZIP"))).toBe(true);
    expect(acceptable(new File(["x"], "notes.txt"))).toBe(false);
  });
  it("takes a dropped file and rejects a wrong one with an alert", () => {
    const onFile = vi.fn();
    render(<FileDrop file={null} onFile={onFile} />);
    const zone = screen.getByTestId("dropzone");
    const good = new File(["def main(args):\n  return 1\n"], "hello.py");
    fireEvent.drop(zone, { dataTransfer: { files: [good] } });
    expect(onFile).toHaveBeenLastCalledWith(good);
    fireEvent.drop(zone, { dataTransfer: { files: [new File(["x"], "a.txt")] } });
    expect(onFile).toHaveBeenLastCalledWith(null);
    expect(screen.getByRole("alert").textContent).toContain("a.txt");
  });
  it("is a labelled file input too", () => {
    const onFile = vi.fn();
    render(<FileDrop file={null} onFile={onFile} />);
    const input = screen.getByLabelText(/Program file/) as HTMLInputElement;
    const f = new File(["x"], "p.zip");
    fireEvent.change(input, { target: { files: [f] } });
    expect(onFile).toHaveBeenCalledWith(f);
  });
});
