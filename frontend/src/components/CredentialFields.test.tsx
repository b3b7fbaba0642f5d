import { fireEvent, render, screen } from "@testing-library/react";
import { describe, expect, it, vi } from "vitest";
import { ApiError } from "../api/errors";
import { CredentialFields, useSignInForm } from "./CredentialFields";

function SignIn({ signIn, email }: { signIn: (email: string, password: string) => Promise<void>; email?: string }) {
  const form = useSignInForm(signIn, email);
  return (
    <form onSubmit={form.submit}>
      <CredentialFields {...form.fields} />
      <button type="submit" disabled={form.busy}>
        Go
      </button>
    </form>
  );
}

const field = (label: string) => screen.getByLabelText(label) as HTMLInputElement;

describe("CredentialFields", () => {
  it("names both fields for password managers and starts in the address when it is empty", () => {
    render(<SignIn signIn={vi.fn()} />);
    expect(field("Email or username").autocomplete).toBe("username");
    expect(field("Password").autocomplete).toBe("current-password");
    expect(document.activeElement).toBe(field("Email or username"));
  });

  it("starts in the password when the address is known", () => {
    render(<SignIn signIn={vi.fn()} email="ada@example.com" />);
    expect(field("Email or username").value).toBe("ada@example.com");
    expect(document.activeElement).toBe(field("Password"));
  });

  it("sends what was typed, shows the refusal, and drops it once the user types again", async () => {
    const signIn = vi.fn().mockRejectedValue(new ApiError(400, "invalid_credentials", "wrong email or password"));
    render(<SignIn signIn={signIn} />);
    fireEvent.change(field("Email or username"), { target: { value: "ada" } });
    fireEvent.change(field("Password"), { target: { value: "nope" } });
    fireEvent.click(screen.getByRole("button", { name: "Go" }));
    expect((await screen.findByRole("alert")).textContent).toContain("wrong email or password");
    expect(signIn).toHaveBeenCalledWith("ada", "nope");
    expect((screen.getByRole("button", { name: "Go" }) as HTMLButtonElement).disabled).toBe(false);
    fireEvent.change(field("Password"), { target: { value: "nope2" } });
    expect(screen.queryByRole("alert")).toBeNull();
  });
});
