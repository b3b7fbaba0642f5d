import { render } from "@testing-library/react";
import { StrictMode, type ReactElement } from "react";
import { MemoryRouter } from "react-router";
import { AuthProvider } from "../auth/AuthContext";

/** Render inside a router at `path` and the real AuthProvider (which calls the mocked /auth/me).
 * `strict` wraps it in StrictMode as main.tsx does, which runs every effect twice on mount. */
export function renderAt(ui: ReactElement, path = "/", { strict = false }: { strict?: boolean } = {}) {
  const tree = (
    <MemoryRouter initialEntries={[path]}>
      <AuthProvider>{ui}</AuthProvider>
    </MemoryRouter>
  );
  return render(strict ? <StrictMode>{tree}</StrictMode> : tree);
}
