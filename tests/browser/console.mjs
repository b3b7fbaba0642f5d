// Drives Debian's /usr/bin/chromium through playwright-core (npm, no browser download) against a
// running Symphony server. Invoked by tests/browser/test_console.py:
//
//   node tests/browser/console.mjs <scenario> '<json config>'
//
// Prints one JSON line {"ok": true, ...} (or {"ok": false, "error": ...}) last; writes
// screenshots to config.shots (and a failure screenshot to config.artifacts).
import { createRequire } from "node:module";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "..", "..", "frontend", "package.json"));
const { chromium } = require("playwright-core");

const [scenarioName, rawConfig] = process.argv.slice(2);
const cfg = JSON.parse(rawConfig ?? "{}");
const base = cfg.baseUrl;
const T = cfg.timeoutMs ?? 15000;

function check(cond, message) {
  if (!cond) throw new Error(`check failed: ${message}`);
}

async function shot(page, name, opts = {}) {
  if (!cfg.shots) return;
  mkdirSync(cfg.shots, { recursive: true });
  await page.waitForTimeout(150); // let charts and fonts settle
  await page.screenshot({ path: path.join(cfg.shots, `${name}.png`), fullPage: true, ...opts });
}

/** The main menu behind its toggle, as on a phone. */
async function gotoNavMobile(page, label, heading) {
  const nav = page.getByRole("navigation", { name: "Main" });
  if (!(await nav.getByRole("link", { name: label }).isVisible())) await page.getByRole("button", { name: "Menu" }).click();
  await nav.getByRole("link", { name: label }).click();
  await page.getByRole("heading", { level: 1, name: heading ?? label }).waitFor({ timeout: T });
}

async function gotoNav(page, label, heading) {
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: label }).click();
  await page.getByRole("heading", { level: 1, name: heading ?? label }).waitFor({ timeout: T });
}

async function signup(page, email, password, tenant) {
  await page.goto(`${base}/signup`);
  await page.getByLabel("Email").fill(email);
  await page.getByLabel("Password").fill(password);
  await page.getByLabel("Organisation (tenant) name").fill(tenant);
  await page.getByRole("button", { name: "Sign up" }).click();
  await page.getByRole("heading", { level: 1, name: "Programs" }).waitFor({ timeout: T });
  await verifyFromMail(page, email);
}

/** After sign-up the console says to check the inbox; the test writes the link mailed to the
 * address (read from its SMTP sink) to cfg.verifyLinkFile, and the page opens it as a person
 * would, then goes back to Programs with the banner gone. */
async function verifyFromMail(page, email) {
  const banner = page.getByTestId("verify-email-banner");
  await banner.waitFor({ timeout: T });
  check((await banner.textContent()).includes(`Check your inbox to verify ${email}`), "verify banner names the address");
  await shot(page, "verify-email-banner");
  const deadline = Date.now() + 60000;
  while (!existsSync(cfg.verifyLinkFile)) {
    check(Date.now() < deadline, "no verification link was mailed");
    await new Promise((r) => setTimeout(r, 100));
  }
  const link = readFileSync(cfg.verifyLinkFile, "utf8").trim();
  check(link.startsWith(`${base}/verify-email/`), `the mailed link points at the console: ${link}`);
  await page.goto(link);
  await page.getByText(`${email} is verified`).waitFor({ timeout: T });
  await shot(page, "verify-email-done");
  await page.getByRole("link", { name: "Go to Programs" }).click();
  await page.getByRole("heading", { level: 1, name: "Programs" }).waitFor({ timeout: T });
  check((await page.getByTestId("verify-email-banner").count()) === 0, "the banner is gone once verified");
}

async function login(page, email, password, landing = "Programs") {
  await page.goto(`${base}/login`);
  await page.getByLabel("Email or username").fill(email);
  await page.getByLabel("Password").fill(password);
  await page.getByRole("button", { name: "Log in" }).click();
  await page.getByRole("heading", { level: 1, name: landing }).waitFor({ timeout: T });
}

/** Nothing on the page is wider than the viewport (no sideways scrolling on a phone). */
async function noOverflow(page, what) {
  const { scroll, width } = await page.evaluate(() => ({ scroll: document.documentElement.scrollWidth, width: window.innerWidth }));
  check(scroll <= width, `${what}: the page is ${scroll} px wide in a ${width} px viewport`);
}

/** The page as it is, at a phone's width: nothing overflows, and its screenshot `name`; then the
 * desktop width again. */
async function atPhoneWidth(page, what, name) {
  await page.setViewportSize({ width: 390, height: 844 });
  await noOverflow(page, `${what} at 390 px`);
  await shot(page, name);
  await page.setViewportSize({ width: 1280, height: 800 });
}

/** The element lies within the viewport's width (a row action one can reach without scrolling sideways). */
async function withinWidth(page, locator, what) {
  await locator.scrollIntoViewIfNeeded();
  const box = await locator.boundingBox();
  const width = await page.evaluate(() => window.innerWidth);
  check(box && box.x >= 0 && box.x + box.width <= width, `${what} at x=${box?.x}..${box ? box.x + box.width : "?"} in ${width} px`);
}

/** WCAG contrast ratio of an element's text colour on the background colour of `bgSelector`. */
async function contrast(page, selector, bgSelector) {
  return page.evaluate(
    ([sel, bgSel]) => {
      const rgb = (css) => css.match(/\d+(\.\d+)?/g).slice(0, 3).map(Number);
      const lum = ([r, g, b]) => {
        const f = (c) => ((c /= 255) <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4);
        return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
      };
      const fg = lum(rgb(getComputedStyle(document.querySelector(sel)).color));
      const bg = lum(rgb(getComputedStyle(document.querySelector(bgSel)).backgroundColor));
      return (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
    },
    [selector, bgSelector],
  );
}

/** Drop a file on the drop zone the way a user's drag and drop does (a real DataTransfer). */
async function dropFile(page, name, content, mime = "text/x-python") {
  const dt = await page.evaluateHandle(
    ([n, c, m]) => {
      const data = new DataTransfer();
      data.items.add(new File([c], n, { type: m }));
      return data;
    },
    [name, content, mime],
  );
  const zone = page.getByTestId("dropzone").first();
  await zone.dispatchEvent("dragover", { dataTransfer: dt });
  await zone.dispatchEvent("drop", { dataTransfer: dt });
}

async function uploadProgram(page, name, source) {
  await dropFile(page, `${name}.py`, source);
  await page.getByText(`Selected: ${name}.py`).waitFor({ timeout: T });
  await page.getByRole("button", { name: "Upload", exact: true }).click();
  await page.getByRole("heading", { level: 1, name }).waitFor({ timeout: T });
}

const scenarios = {
  /** sign up → upload (drag and drop) → list shows it → API key create/revoke → team invite
   * link/revoke → usage → KV → log out/in. */
  async tenant(page) {
    const out = {};
    await page.goto(`${base}/programs`);
    await page.getByRole("heading", { name: "Log in" }).waitFor({ timeout: T }); // anonymous → login
    await shot(page, "login");
    await signup(page, cfg.email, cfg.password, cfg.tenant);
    // The list loads after the heading shows: wait for its empty state rather than count at once
    // (counting raced the fetch in a CI run and saw nothing yet).
    await page.getByText(/No programs yet/).waitFor({ timeout: T });
    check((await page.getByText(/No programs yet/).count()) === 1, "empty program list after sign-up");

    await uploadProgram(page, cfg.programName, cfg.programSource);
    await page.getByText("def main(args):").first().waitFor({ timeout: T }); // code viewer
    await page.getByRole("button", { name: "Run program" }).waitFor({ timeout: T });
    await shot(page, "program");

    await gotoNav(page, "Programs");
    const row = page.getByRole("row").filter({ hasText: cfg.programName });
    await row.waitFor({ timeout: T });
    check((await row.getByText("v1").count()) === 1, "program list shows v1");
    await shot(page, "programs");

    await gotoNav(page, "API keys");
    await page.getByLabel("Name", { exact: true }).fill("ci-key");
    await page.getByRole("button", { name: "Create key" }).click();
    const secret = (await page.getByTestId("api-key-secret").textContent({ timeout: T })) ?? "";
    check(/^sk_[A-Za-z0-9]+_\S+$/.test(secret), `secret looks like a key: ${secret.slice(0, 12)}…`);
    out.secret = secret;
    out.prefix = secret.split("_")[1];
    await page.getByRole("button", { name: "Copy secret" }).waitFor();
    await shot(page, "api-keys");
    // The key works against the REST API before it is revoked.
    out.keyStatusBefore = (await fetch(`${base}/api/v1/programs`, { headers: { Authorization: `Bearer ${secret}` } })).status;
    await page.getByRole("button", { name: "I have stored it" }).click();
    check((await page.getByTestId("api-key-secret").count()) === 0, "secret hidden after dismiss");
    const keyRow = page.getByRole("row").filter({ hasText: `sk_${out.prefix}_` });
    await keyRow.getByRole("button", { name: "Revoke ci-key" }).click();
    await keyRow.getByRole("button", { name: "Revoke now" }).click();
    await keyRow.getByText("revoked").waitFor({ timeout: T });
    out.keyStatusAfter = (await fetch(`${base}/api/v1/programs`, { headers: { Authorization: `Bearer ${secret}` } })).status;

    // Team: the owner invites an address and gets the link, shown once; the link opens the
    // invitation (for another address than the signed-in owner's); revoking empties the list.
    await gotoNav(page, "Team");
    await page.getByRole("row").filter({ hasText: cfg.email }).getByText("you", { exact: true }).waitFor({ timeout: T });
    const invitee = cfg.inviteEmail ?? `invitee-${Date.now()}@example.com`;
    await page.getByLabel("Email").fill(invitee);
    await page.getByRole("button", { name: "Create invitation link" }).click();
    const link = (await page.getByTestId("invite-link").textContent({ timeout: T })) ?? "";
    check(link.startsWith(`${new URL(base).origin}/invite/inv_`), `invitation link: ${link.slice(0, 40)}…`);
    out.inviteLink = link;
    out.inviteMail = ((await page.getByTestId("invite-mail").textContent()) ?? "").trim();
    const pending = page.getByRole("table", { name: "Pending invitations" }).getByRole("row").filter({ hasText: invitee });
    await pending.waitFor({ timeout: T });
    await shot(page, "team");
    await page.getByRole("button", { name: "Done" }).click();
    check((await page.getByTestId("invite-link").count()) === 0, "invitation link hidden after dismiss");
    await page.goto(link);
    await page.getByRole("heading", { name: `Join ${cfg.tenant}` }).waitFor({ timeout: T });
    await page.getByText(`This invitation is for ${invitee}`).waitFor({ timeout: T });
    await shot(page, "invite");
    await page.goto(`${base}/team`);
    await pending.getByRole("button", { name: `Revoke invitation for ${invitee}` }).click();
    await pending.getByRole("button", { name: "Revoke now" }).click();
    await page.getByText("No pending invitations.").waitFor({ timeout: T });
    // The owner's activity log shows both changes, newest first.
    const activity = page.getByRole("table", { name: "Activity" });
    await activity.getByText("invitation.revoke").waitFor({ timeout: T });
    await activity.getByText("invitation.create").waitFor({ timeout: T });

    await gotoNav(page, "Usage & billing");
    await page.getByRole("img", { name: /Tokens per day/ }).waitFor({ timeout: T });
    await page.getByRole("meter", { name: "Concurrent runs" }).waitFor({ timeout: T });
    await page.getByRole("heading", { name: "Invoices" }).waitFor();

    await gotoNav(page, "KV files");
    await page.locator(".empty, table").first().waitFor({ timeout: T });

    await gotoNav(page, "Runs");

    // Non-staff: no Staff link.
    check((await page.getByRole("link", { name: "Staff" }).count()) === 0, "no Staff link for a tenant user");

    // Responsive: the menu collapses behind a toggle on a phone-sized viewport.
    await page.setViewportSize({ width: 390, height: 844 });
    await page.getByRole("button", { name: "Menu" }).click();
    await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Programs" }).click();
    await page.getByRole("heading", { level: 1, name: "Programs" }).waitFor({ timeout: T });
    await shot(page, "programs-mobile", { fullPage: false });
    await page.setViewportSize({ width: 1280, height: 800 });

    await page.getByRole("button", { name: "Log out" }).click();
    await page.getByRole("heading", { name: "Log in" }).waitFor({ timeout: T });
    await login(page, cfg.email, cfg.password);
    await page.getByRole("row").filter({ hasText: cfg.programName }).waitFor({ timeout: T });
    return out;
  },

  /** Someone without an account opens an owner's invitation link: signs up through it, lands in
   * the tenant as a member (its programs, the Team page without owner controls), leaves it, and
   * finds the spent link refused. */
  async join(page) {
    const out = {};
    await page.goto(cfg.inviteLink);
    await page.getByRole("heading", { name: `Join ${cfg.tenant}` }).waitFor({ timeout: T });
    check((await page.getByLabel("Email").inputValue()) === cfg.email, "the invited address is filled in, read-only");
    await page.getByLabel("Password").fill(cfg.password);
    await page.getByRole("button", { name: "Sign up and join" }).click();
    await page.getByRole("heading", { level: 1, name: "Programs" }).waitFor({ timeout: T });
    await page.getByRole("row").filter({ hasText: cfg.programName }).waitFor({ timeout: T }); // the tenant's program

    await gotoNav(page, "Team");
    const me = page.getByRole("row").filter({ hasText: cfg.email });
    await me.getByText("you", { exact: true }).waitFor({ timeout: T });
    out.myRole = (await me.getByRole("cell").nth(1).textContent()) ?? "";
    out.ownerRow = (await page.getByRole("row").filter({ hasText: cfg.ownerEmail }).textContent()) ?? "";
    out.inviteControls = await page.getByRole("button", { name: "Create invitation link" }).count();
    out.roleSelects = await page.getByRole("combobox").count();

    await me.getByRole("button", { name: "Leave tenant" }).click();
    await me.getByRole("button", { name: "Leave now" }).click();
    await page.getByRole("heading", { level: 1, name: "No tenant" }).waitFor({ timeout: T });

    await page.goto(cfg.inviteLink);
    await page.getByRole("alert").filter({ hasText: "This invitation link is not valid" }).waitFor({ timeout: T });
    return out;
  },

  /** An owner of two tenants closes the active one from its Team page; the console moves to the other. */
  async close(page) {
    const out = {};
    await login(page, cfg.email, cfg.password);
    await page.getByRole("row").filter({ hasText: cfg.closingProgram }).waitFor({ timeout: T });
    await gotoNav(page, "Team");
    const form = page.getByRole("form", { name: "Close this tenant" });
    const button = form.getByRole("button", { name: "Close tenant" });
    await form.getByLabel(/to confirm/).fill(cfg.tenantName); // the name, not the slug
    out.armedByName = await button.isEnabled();
    await form.getByLabel(/to confirm/).fill(cfg.slug);
    await shot(page, "close-tenant");
    await button.click();
    await page.getByRole("heading", { level: 1, name: "Programs" }).waitFor({ timeout: T });
    await page.getByRole("row").filter({ hasText: cfg.stayingProgram }).waitFor({ timeout: T });
    out.tenantShown = (await page.locator(".tenant-name").textContent()) ?? "";
    return out;
  },

  /** Forgot the password: from the login page to the "we sent a link" confirmation. The test
   * then reads the mail the real SMTP sink received and hands its link to `resetPassword`. */
  async forgotPassword(page) {
    await page.goto(`${base}/login`);
    await page.getByRole("heading", { name: "Log in" }).waitFor({ timeout: T });
    await page.getByLabel("Email or username").fill(cfg.email);
    await page.getByRole("link", { name: "Forgot your password?" }).click();
    await page.getByRole("heading", { name: "Reset your password" }).waitFor({ timeout: T });
    check((await page.getByLabel("Email").inputValue()) === cfg.email, "the address typed on the login page came along");
    await shot(page, "forgot-password");
    await page.getByRole("button", { name: "Send reset link" }).click();
    const sent = page.getByText(/we sent a link to reset its password/);
    await sent.waitFor({ timeout: T });
    const confirmation = ((await sent.textContent()) ?? "").trim();
    check(confirmation.includes(`If an account uses ${cfg.email},`), `confirmation names the address: ${confirmation}`);
    check((await page.getByRole("button", { name: "Send reset link" }).count()) === 0, "the form is replaced");
    await shot(page, "forgot-password-sent");
    return { confirmation };
  },

  /** The mailed link: a mismatched confirmation is caught on the page; the new password is set,
   * the login page says so, and the new password logs in. */
  async resetPassword(page) {
    await page.goto(cfg.resetLink);
    await page.getByRole("heading", { name: "Choose a new password" }).waitFor({ timeout: T });
    await page.getByLabel(/^New password/).fill(cfg.newPassword);
    await page.getByLabel("Confirm new password").fill(`${cfg.newPassword}x`);
    await page.getByRole("button", { name: "Set new password" }).click();
    await page.getByRole("alert").filter({ hasText: "do not match" }).waitFor({ timeout: T });
    await page.getByLabel("Confirm new password").fill(cfg.newPassword);
    await shot(page, "reset-password");
    await page.getByRole("button", { name: "Set new password" }).click();
    await page.getByRole("heading", { name: "Log in" }).waitFor({ timeout: T });
    const notice = ((await page.getByRole("status").textContent({ timeout: T })) ?? "").trim();
    check(notice === "Your password was changed. Log in with the new one.", `notice on the login page: ${notice}`);
    await shot(page, "login-password-changed");
    await page.getByLabel("Email or username").fill(cfg.email);
    await page.getByLabel("Password").fill(cfg.newPassword);
    await page.getByRole("button", { name: "Log in" }).click();
    await page.getByRole("heading", { level: 1, name: "Programs" }).waitFor({ timeout: T });
    return { notice, landed: new URL(page.url()).pathname };
  },

  /** Signed in with the old address: the Account page asks to sign in with a new one. A wrong
   * password is refused on the page; the right one mails a link to the new address (the test
   * reads it from the SMTP sink and hands it to `confirmEmail`), and nothing changes yet. */
  async changeEmail(page) {
    await login(page, cfg.email, cfg.password);
    await page.getByRole("link", { name: "Account", exact: true }).click();
    await page.getByRole("heading", { level: 1, name: "Account" }).waitFor({ timeout: T });
    const form = page.getByRole("form", { name: "Email address" });
    const current = ((await form.getByTestId("current-email").textContent({ timeout: T })) ?? "").trim();
    check(current === cfg.email, `the card shows the current address: ${current}`);
    await form.getByLabel("New email").fill(cfg.newEmail);
    await form.getByLabel("Current password").fill(`${cfg.password}-wrong`);
    await form.getByRole("button", { name: "Send confirmation link" }).click();
    await form.getByRole("alert").filter({ hasText: "wrong password" }).waitFor({ timeout: T });
    await form.getByLabel("Current password").fill(cfg.password);
    await form.getByRole("button", { name: "Send confirmation link" }).click();
    const sent = form.getByRole("status").filter({ hasText: "We sent a link to" });
    await sent.waitFor({ timeout: T });
    const notice = ((await sent.textContent()) ?? "").trim();
    check((await form.getByRole("alert").count()) === 0, "the wrong-password error is gone");
    check((await form.getByLabel("New email").inputValue()) === "", "the form is cleared");
    check((await form.getByLabel("Current password").inputValue()) === "", "the password is cleared");
    // The change waits for the link: the header still shows the old address.
    const header = ((await page.locator(".user-email").textContent()) ?? "").trim();
    check(header === cfg.email, `header before the link is opened: ${header}`);
    await shot(page, "account-email");
    return { notice };
  },

  /** The mailed link, opened in a console signed in with the old address (this run's fresh
   * profile logs in first): the page confirms the change at once and the header follows. */
  async confirmEmail(page) {
    await login(page, cfg.email, cfg.password);
    await page.goto(cfg.confirmLink);
    await page.getByRole("heading", { name: "Confirm your new email address" }).waitFor({ timeout: T });
    const done = page.getByRole("status").filter({ hasText: "now signs in with" });
    await done.waitFor({ timeout: T });
    const notice = ((await done.textContent()) ?? "").trim();
    check((await page.getByRole("alert").count()) === 0, "no error beside the confirmation");
    await shot(page, "confirm-email");
    await page.getByRole("link", { name: "Go to Programs" }).click();
    await page.getByRole("heading", { level: 1, name: "Programs" }).waitFor({ timeout: T });
    const header = ((await page.locator(".user-email").textContent({ timeout: T })) ?? "").trim();
    await page.getByRole("link", { name: "Account", exact: true }).click();
    await page.getByRole("heading", { level: 1, name: "Account" }).waitFor({ timeout: T });
    const account = ((await page.getByTestId("current-email").textContent({ timeout: T })) ?? "").trim();
    return { notice, header, account };
  },

  /** A staff user sees the Admin page: tenants, all KV files, worker health. */
  async staff(page) {
    await login(page, cfg.email, cfg.password);
    await gotoNav(page, "Staff");
    await page.getByRole("heading", { name: "Tenants" }).waitFor({ timeout: T });
    for (const slug of cfg.expectTenants ?? []) await page.getByRole("cell", { name: new RegExp(slug) }).first().waitFor({ timeout: T });
    await page.getByRole("heading", { name: "All KV files" }).waitFor();
    await page.getByRole("heading", { name: "Worker health" }).waitFor();
    await page.getByText(/Control plane:/).waitFor({ timeout: T });
    return {};
  },

  /** Content-Security-Policy: the console, the admin's login page, Swagger UI and DRF's
   * browsable API load under their policies with no violation, and a script injected inline
   * into the console does not run (the violation is reported instead). */
  async csp(page) {
    await page.goto(`${base}/login`);
    await page.getByRole("heading", { name: "Log in" }).waitFor({ timeout: T });
    const pagesOk = await page.evaluate(() => window.__cspViolations.length === 0);
    check(pagesOk, `console violations: ${JSON.stringify(await page.evaluate(() => window.__cspViolations))}`);
    await page.evaluate(() => {
      const s = document.createElement("script");
      s.textContent = "window.__inlineRan = true;";
      document.body.appendChild(s);
    });
    await page.waitForTimeout(200);
    const inlineRan = await page.evaluate(() => window.__inlineRan === true);
    const blocked = await page.evaluate(() => window.__cspViolations.map((v) => v.directive));
    const visited = {};
    for (const [name, url, ready] of [
      ["admin", `${base}/admin/login/`, "#id_username"],
      ["swagger", `${base}/api/docs/`, "#swagger-ui"],
      ["browsable", `${base}/api/v1/auth/csrf`, ".response-info"],
    ]) {
      await page.goto(url);
      await page.locator(ready).first().waitFor({ state: "attached", timeout: T });
      await page.waitForTimeout(300);
      visited[name] = await page.evaluate(() => window.__cspViolations);
    }
    return { inlineRan, blocked, visited };
  },

  /** Run the program: tokens appear live, KV panel fills, usage shows tokens; staff evicts. */
  async run(page) {
    const out = {};
    await login(page, cfg.email, cfg.password);
    await page.getByRole("link", { name: cfg.programName }).click();
    await page.getByLabel(/Arguments/).fill(JSON.stringify(cfg.args ?? {}));
    await page.getByRole("button", { name: "Run program" }).click();
    await page.getByRole("heading", { level: 1, name: /^Run / }).waitFor({ timeout: T });
    out.runId = page.url().split("/runs/")[1];
    const stream = page.getByTestId("token-stream");
    // Live: the streamed text grows in several steps before the run finishes.
    const lengths = new Set();
    const deadline = Date.now() + (cfg.runTimeoutMs ?? 180000);
    while (Date.now() < deadline) {
      const status = (await page.getByTestId("run-status").textContent()) ?? "";
      const count = Number((await page.getByTestId("token-count").textContent()) ?? "0");
      if (count > 0) lengths.add(count);
      if (/succeeded|failed|timed out|cancelled/.test(status)) {
        out.status = status.trim();
        break;
      }
      await page.waitForTimeout(100);
    }
    out.liveSteps = lengths.size;
    out.text = await stream.textContent();
    out.kvSamples = await page.getByRole("img", { name: /KV pages over time/ }).count();
    await shot(page, "run-live");
    await gotoNav(page, "Usage & billing");
    out.usage = await page.getByTestId("usage-totals").textContent({ timeout: T });
    await gotoNav(page, "KV files");
    await shot(page, "kv-files-after-run");
    return out;
  },

  /** Seeded tenant: the run page follows a live (Redis → SSE) stream; data pages render it. */
  async populated(page) {
    const out = {};
    await login(page, cfg.email, cfg.password);
    await page.goto(`${base}/runs/${cfg.runId}`);
    await page.getByRole("heading", { level: 1, name: /^Run / }).waitFor({ timeout: T });
    writeFileSync(cfg.readyFile, "ready"); // the test starts publishing events now
    const counts = new Set();
    const deadline = Date.now() + 60000;
    let status = "";
    while (Date.now() < deadline) {
      counts.add(Number((await page.getByTestId("token-count").textContent()) ?? "0"));
      status = ((await page.getByTestId("run-status").textContent()) ?? "").trim();
      if (status === "succeeded") break;
      await page.waitForTimeout(50);
    }
    out.status = status;
    out.liveSteps = [...counts].filter((c) => c > 0).length;
    out.text = await page.getByTestId("token-stream").textContent();
    out.kvChart = await page.getByRole("img", { name: /KV pages over time/ }).count();
    out.result = await page.getByTestId("run-result").textContent({ timeout: T });
    await shot(page, "run");

    await gotoNav(page, "Runs");
    await page.getByRole("row").filter({ hasText: "succeeded" }).first().waitFor({ timeout: T });
    await shot(page, "runs");

    await gotoNav(page, "Usage & billing");
    out.usage = await page.getByTestId("usage-totals").textContent({ timeout: T });
    const byProgram = page.getByRole("table", { name: "Usage by program" }).getByRole("row").filter({ hasText: cfg.programName });
    out.byProgram = (await byProgram.textContent({ timeout: T })) ?? "";
    await page.locator(".invoice summary").first().click();
    await page.getByRole("cell", { name: "Decode tokens" }).first().waitFor({ timeout: T });
    await shot(page, "usage");

    await gotoNav(page, "KV files");
    await page.getByRole("cell", { name: cfg.kvName, exact: true }).waitFor({ timeout: T });
    out.stale = await page.getByText(/worker is unreachable/).count();
    await shot(page, "kv-files");

    await gotoNav(page, "Staff");
    await page.getByRole("button", { name: `Evict ${cfg.kvTenant}/${cfg.kvName}` }).waitFor({ timeout: T });
    await shot(page, "staff");
    return out;
  },

  async evict(page) {
    await login(page, cfg.email, cfg.password);
    await gotoNav(page, "Staff");
    const label = `Evict ${cfg.kvTenant}/${cfg.kvName}`;
    await page.getByRole("button", { name: label }).click();
    await page.getByRole("button", { name: "Evict now" }).click();
    await page.getByText(`Evicted ${cfg.kvTenant}/${cfg.kvName}`).waitFor({ timeout: T });
    // The worker's engine timeline, read from the worker on request: the run's forwards as bars.
    await page.getByTestId("engine-timeline-show").first().click();
    await page.getByTestId("engine-strip").first().waitFor({ timeout: T });
    const engineBars = await page.getByTestId("engine-bar").count();
    const engineBusy = ((await page.getByTestId("engine-busy").first().textContent()) ?? "").trim();
    const engineLongest = ((await page.getByTestId("engine-longest").first().textContent()) ?? "").trim();
    await shot(page, "staff-engine-timeline");
    return { engineBars, engineBusy, engineLongest };
  },

  /** The operator signs in with what `make up` printed (the username), lands on the staff page
   * (no tenant of their own), reloads it, finds Django's admin at /admin/, changes a tenant's
   * plan and closes another from the tenants table; on a phone the table's actions stay reachable. */
  async staffSignIn(page) {
    const out = {};
    await login(page, cfg.username, cfg.password, "Staff");
    out.landed = new URL(page.url()).pathname;
    await page.reload();
    await page.getByRole("heading", { level: 1, name: "Staff" }).waitFor({ timeout: T });
    const tenants = page.getByRole("table", { name: "Tenants" });
    const planRow = tenants.getByRole("row").filter({ hasText: cfg.planTenant });
    await planRow.getByLabel(`Plan of ${cfg.planTenant}`).selectOption(cfg.newPlan);
    await planRow.getByRole("button", { name: "Change plan" }).click();
    await page.getByText(`${cfg.planTenant} is on the ${cfg.newPlan} plan now.`).waitFor({ timeout: T });
    const closeRow = tenants.getByRole("row").filter({ hasText: cfg.closeTenant });
    await closeRow.getByRole("button", { name: `Close ${cfg.closeTenant}` }).click();
    await closeRow.getByRole("button", { name: `Close ${cfg.closeTenant} and delete its data` }).click();
    await page.getByText(`Closed ${cfg.closeTenant}`).waitFor({ timeout: T });
    await closeRow.getByText(/^closed/).waitFor({ timeout: T });
    const open = planRow.getByRole("link", { name: `Open ${cfg.planTenant} in the Django admin` });
    out.openHref = await open.getAttribute("href");
    await shot(page, "staff-tenants");
    await page.setViewportSize({ width: 390, height: 844 });
    await noOverflow(page, "staff page at 390 px");
    await withinWidth(page, planRow.getByRole("button", { name: "Change plan" }), "Change plan");
    await withinWidth(page, open, "Open");
    await shot(page, "staff-mobile", { fullPage: false });
    await page.setViewportSize({ width: 1280, height: 800 });
    // /admin is Django's admin, not the console's page.
    await page.goto(`${base}/admin/`);
    await page.locator("#site-name").waitFor({ timeout: T });
    out.adminTitle = await page.title();
    // Signing in with the email address works as well.
    await page.goto(`${base}/staff`);
    await page.getByRole("button", { name: "Log out" }).click();
    await page.getByRole("heading", { name: "Log in" }).waitFor({ timeout: T }); // signed out
    await login(page, cfg.email, cfg.password, "Staff");
    return out;
  },

  /** A newcomer: the landing page says what Symphony is; sign-up refuses "password" next to the
   * field; "Try an example" uploads one and opens its run form filled in; a plan limit is said
   * next to Max tokens; a too-large file and a name with "/" are refused; on a phone nothing
   * overflows and the code viewer's line numbers are readable. */
  async firstMinutes(page) {
    const out = {};
    const posts = [];
    page.on("request", (r) => r.method() === "POST" && posts.push(new URL(r.url()).pathname));
    await page.goto(`${base}/`);
    await page.getByRole("heading", { name: "Log in" }).waitFor({ timeout: T });
    out.tagline = ((await page.getByTestId("tagline").textContent()) ?? "").trim();
    await shot(page, "login");
    await atPhoneWidth(page, "login page", "login-mobile");
    await page.getByRole("link", { name: "Sign up" }).click();
    await page.getByLabel("Email").fill(cfg.email);
    await page.getByLabel("Password").fill("password");
    await page.getByLabel("Organisation (tenant) name").fill(cfg.tenant);
    await page.getByRole("button", { name: "Sign up" }).click();
    const pwError = page.locator("#signup-password-error");
    await pwError.filter({ hasText: /too common/ }).waitFor({ timeout: T });
    out.passwordError = ((await pwError.textContent()) ?? "").trim();
    out.passwordInvalid = await page.getByLabel("Password").getAttribute("aria-invalid");
    await shot(page, "signup-weak-password");
    await atPhoneWidth(page, "sign-up page", "signup-weak-password-mobile");
    await page.getByLabel("Password").fill(cfg.password);
    await page.getByRole("button", { name: "Sign up" }).click();
    await page.getByRole("heading", { level: 1, name: "Programs" }).waitFor({ timeout: T });
    await verifyFromMail(page, cfg.email);
    await page.getByText(/No programs yet/).waitFor({ timeout: T });
    await shot(page, "programs-empty");

    // Too large: refused in the browser, nothing sent.
    const before = posts.length;
    await dropFile(page, "huge.py", "#".repeat(cfg.tooLarge));
    const fileError = page.getByTestId("file-error");
    await fileError.waitFor({ timeout: T });
    out.sizeError = ((await fileError.textContent()) ?? "").trim();
    await page.getByRole("button", { name: "Upload", exact: true }).click();
    await page.waitForTimeout(300);
    out.postsForHugeFile = posts.slice(before).filter((p) => p === "/api/v1/programs").length;

    // A name with "/" is refused next to the Name field.
    await dropFile(page, "ok.py", "def main(args):\n    return 1\n");
    await page.getByText("Selected: ok.py").waitFor({ timeout: T });
    await page.getByLabel("Name", { exact: true }).fill("team/ok");
    await page.getByRole("button", { name: "Upload", exact: true }).click();
    const nameError = page.locator("#program-name-error");
    await nameError.filter({ hasText: /must not contain/ }).waitFor({ timeout: T });
    out.nameError = ((await nameError.textContent()) ?? "").trim();

    // Try an example: its run form opens with the declared arguments.
    await page.getByRole("button", { name: "Try an example" }).first().click();
    await page.getByRole("heading", { level: 1, name: "completion-example" }).waitFor({ timeout: T });
    await page.getByText("This is the example program").waitFor({ timeout: T });
    out.exampleArgs = JSON.parse(await page.getByLabel(/Arguments/).inputValue());
    await page.getByText("def main(args):").first().waitFor({ timeout: T });
    out.lineNumberContrast = await contrast(page, ".code-ln", ".code pre");
    await shot(page, "program-example");

    // A plan limit, in words next to the field; no run was created.
    await page.getByLabel("Max tokens").fill("100000");
    await page.getByRole("button", { name: "Run program" }).click();
    const maxError = page.locator("#run-max-tokens-error");
    await maxError.filter({ hasText: /at most/ }).waitFor({ timeout: T });
    out.maxTokensError = ((await maxError.textContent()) ?? "").trim();
    check(new URL(page.url()).pathname.startsWith("/programs/"), "stayed on the program page");
    await shot(page, "run-limit-error");

    // A phone: the program page's Run card and source fit.
    await page.setViewportSize({ width: 390, height: 844 });
    await page.reload();
    await page.getByRole("heading", { level: 1, name: "completion-example" }).waitFor({ timeout: T });
    await page.getByText("def main(args):").first().waitFor({ timeout: T });
    await noOverflow(page, "program page at 390 px");
    const runCard = page.getByRole("form", { name: "Run" });
    await withinWidth(page, runCard, "Run card");
    await withinWidth(page, page.getByLabel(/Arguments/), "arguments box");
    await shot(page, "program-mobile");
    await gotoNavMobile(page, "Programs");
    await noOverflow(page, "programs at 390 px");
    await shot(page, "programs-mobile", { fullPage: false });
    return out;
  },

  /** Seeded runs: the list shows program names, filters, and follows a run that is cancelled
   * meanwhile; a run page shows stdout recorded after its end without a reload, the same first
   * token time live and after a reload, KV time labels; a failed run's traceback is kept as
   * printed; at 390 px the KV table's long names truncate and row actions stay on screen. */
  async follow(page) {
    const out = {};
    await login(page, cfg.email, cfg.password);
    await gotoNav(page, "Runs");
    const table = page.getByRole("table", { name: "Runs" });
    const running = table.getByRole("row").filter({ has: page.getByRole("link", { name: cfg.runningId.slice(0, 8) }) });
    await running.getByText("running").waitFor({ timeout: T });
    out.programCell = ((await running.getByRole("cell").nth(1).textContent()) ?? "").trim();
    writeFileSync(cfg.cancelFile, "now"); // the test cancels the run through the API now
    const t0 = Date.now();
    await running.getByText("cancelled").waitFor({ timeout: 8000 });
    out.listUpdatedMs = Date.now() - t0;
    await page.getByLabel("Status").selectOption("failed");
    await table.getByRole("row").filter({ hasText: "failed" }).first().waitFor({ timeout: T });
    await page.waitForTimeout(300);
    out.filteredStatuses = await table.locator("tbody tr").evaluateAll((rows) => rows.map((r) => r.cells[2].textContent.trim()));
    await page.getByLabel("Program").selectOption({ label: cfg.otherProgram });
    await page.getByText("No runs match these filters.").waitFor({ timeout: T });
    await shot(page, "runs-filtered");
    await page.getByLabel("Status").selectOption("");
    await page.getByLabel("Program").selectOption("");

    // A failed run: the traceback as printed, with copy.
    await page.goto(`${base}/runs/${cfg.failedId}`);
    const tb = page.getByTestId("run-traceback");
    await tb.waitFor({ timeout: T });
    out.traceback = await tb.textContent();
    out.tracebackWhiteSpace = await tb.evaluate((el) => getComputedStyle(el).whiteSpace);
    await page.getByRole("button", { name: "Copy error" }).waitFor();
    await shot(page, "run-failed");
    // Its run tree links to the run it spawned, and to the runs list filtered by parent.
    await page.getByTestId("run-children").getByRole("link", { name: cfg.childId.slice(0, 8) }).waitFor({ timeout: T });
    await page.getByRole("link", { name: "in the runs list" }).click();
    await page.getByTestId("parent-filter").waitFor({ timeout: T });
    await table.getByRole("link", { name: cfg.childId.slice(0, 8) }).waitFor({ timeout: T });
    out.spawnedByParent = await table.locator("tbody tr").evaluateAll((rows) => rows.map((r) => r.cells[0].querySelector("a").textContent.trim()));

    // A live run: tokens, then the test cancels it here and records its output a moment later.
    await page.goto(`${base}/runs/${cfg.liveId}`);
    await page.getByRole("heading", { level: 1, name: /^Run / }).waitFor({ timeout: T });
    writeFileSync(cfg.readyFile, "ready");
    await page.getByTestId("first-token").filter({ hasText: /after the run was created/ }).waitFor({ timeout: 30000 });
    await page.waitForFunction(() => Number(document.querySelector('[data-testid="token-count"]')?.textContent) >= 5, null, { timeout: 30000 });
    out.firstTokenLive = ((await page.getByTestId("first-token").textContent()) ?? "").trim();
    await page.getByRole("button", { name: "Cancel run" }).click();
    await page.getByRole("button", { name: "Cancel now" }).click();
    await page.getByTestId("run-status").filter({ hasText: "cancelled" }).waitFor({ timeout: T });
    writeFileSync(cfg.cancelledFile, "cancelled"); // the test records the run's output now
    await page.getByTestId("run-stdout").filter({ hasText: cfg.stdout }).waitFor({ timeout: 10000 });
    out.xTicks = await page.locator(".x-tick").allTextContents();
    await shot(page, "run-cancelled");
    await page.reload();
    await page.getByTestId("first-token").filter({ hasText: /after the run was created/ }).waitFor({ timeout: T });
    out.firstTokenReloaded = ((await page.getByTestId("first-token").textContent()) ?? "").trim();

    // Phones: the KV table stacks, a long name truncates with a title, actions are on screen.
    await page.setViewportSize({ width: 390, height: 844 });
    await page.goto(`${base}/kv-files`);
    const name = page.locator(".truncate", { hasText: cfg.longKvName.slice(0, 20) });
    await name.waitFor({ timeout: T });
    out.kvTitle = await name.getAttribute("title");
    out.kvNameWidth = (await name.boundingBox())?.width ?? 0;
    await noOverflow(page, "KV files at 390 px");
    await withinWidth(page, page.getByRole("button", { name: `Delete ${cfg.longKvName}` }), "Delete of the long-named file");
    await shot(page, "kv-files-mobile");
    await gotoNavMobile(page, "Runs");
    await noOverflow(page, "runs at 390 px");
    await shot(page, "runs-mobile", { fullPage: false });
    await gotoNavMobile(page, "API keys");
    await page.getByLabel("Name", { exact: true }).fill("phone-key");
    await page.getByRole("button", { name: "Create key" }).click();
    await page.getByRole("button", { name: "I have stored it" }).click();
    await withinWidth(page, page.getByRole("button", { name: "Revoke phone-key" }), "Revoke");
    await noOverflow(page, "API keys at 390 px");
    await shot(page, "api-keys-mobile", { fullPage: false });
    await gotoNavMobile(page, "Team");
    await withinWidth(page, page.getByRole("button", { name: "Leave tenant" }), "Leave");
    await noOverflow(page, "team at 390 px");
    await gotoNavMobile(page, "Usage & billing");
    await noOverflow(page, "usage at 390 px");
    await shot(page, "usage-mobile", { fullPage: false });
    return out;
  },

  /** The second pass over what a newcomer trips on: the login form, focus after moving, an
   * ended session mid-form, a failed run's summary, a cancel asked for here, the run's KV
   * figures, singular counts, one first-token figure, scope boxes after a key, and every page
   * at 390 px without sideways scrolling. */
  async secondPass(page) {
    const out = {};
    // Login: the address field has focus, and a refusal goes once the user types again.
    await page.goto(`${base}/login`);
    await page.getByRole("heading", { name: "Log in" }).waitFor({ timeout: T });
    out.loginFocus = await page.evaluate(() => document.activeElement?.getAttribute("autocomplete"));
    await page.getByLabel("Email or username").fill(cfg.email);
    await page.getByLabel("Password").fill("not-the-password");
    await page.getByRole("button", { name: "Log in" }).click();
    await page.getByRole("alert").first().waitFor({ timeout: T });
    await page.getByLabel("Password").fill(cfg.password);
    out.loginErrorAfterTyping = await page.getByRole("alert").count();
    await page.getByRole("button", { name: "Log in" }).click();
    await page.getByRole("heading", { level: 1, name: "Programs" }).waitFor({ timeout: T });

    // Moving within the console puts focus on the new page's heading; the ring is visible.
    await gotoNav(page, "Runs");
    await page.waitForFunction(() => document.activeElement?.tagName === "H1", null, { timeout: T });
    out.focusAfterNav = await page.evaluate(() => `${document.activeElement?.tagName}:${document.activeElement?.textContent}`);
    await page.keyboard.press("Tab");
    out.focusRingContrast = await page.evaluate(() => {
      const rgb = (css) => css.match(/\d+(\.\d+)?/g).slice(0, 3).map(Number);
      const lum = ([r, g, b]) => {
        const f = (c) => ((c /= 255) <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4);
        return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
      };
      const el = document.activeElement;
      const ring = lum(rgb(getComputedStyle(el).outlineColor));
      const ratios = [getComputedStyle(document.body).backgroundColor, getComputedStyle(document.documentElement).backgroundColor, "rgb(255, 255, 255)"]
        .filter((c) => !c.startsWith("rgba(0, 0, 0, 0)"))
        .map((c) => lum(rgb(c)))
        .map((bg) => (Math.max(ring, bg) + 0.05) / (Math.min(ring, bg) + 0.05));
      return { tag: el.tagName, style: getComputedStyle(el).outlineStyle, min: Math.min(...ratios) };
    });

    // A failed run: the heading names the exception; one first-token figure; "1 event".
    await page.goto(`${base}/runs/${cfg.failedId}`);
    const summary = page.getByTestId("run-error-summary");
    await summary.waitFor({ timeout: T });
    out.errorSummary = ((await summary.textContent()) ?? "").trim();
    out.streamed = ((await page.getByTestId("usage-streamed").textContent({ timeout: T })) ?? "").trim();
    out.firstTokenLabels = await page.locator("dt").filter({ hasText: /first token/i }).count();
    out.firstToken = ((await page.getByTestId("first-token").textContent()) ?? "").trim();
    out.failedRunCost = ((await page.getByTestId("usage-cost").textContent()) ?? "").trim();
    await shot(page, "run-failed");

    // Usage & billing: a cost per group and per range, and invoices whose days sum to the total.
    await gotoNav(page, "Usage & billing");
    const invoice = page.locator("details.invoice").first();
    await invoice.waitFor({ timeout: T });
    await invoice.locator("summary").click();
    out.invoiceTotal = ((await invoice.locator("summary strong").textContent()) ?? "").trim();
    out.invoiceLines = await invoice.locator("table").first().locator("tbody tr").evaluateAll((rows) => rows.map((r) => r.cells[3].textContent.trim()));
    out.invoiceDays = await invoice.getByTestId("invoice-days").locator("tbody tr").evaluateAll((rows) => rows.map((r) => [r.cells[0].textContent.trim(), r.cells[1].textContent.trim(), r.cells[2].textContent.trim()]));
    await page.getByTestId("group-cost").first().waitFor({ timeout: T });
    out.groupCosts = await page.getByTestId("group-cost").allTextContents();
    out.usageTotals = ((await page.getByTestId("usage-totals").textContent()) ?? "").trim();
    await shot(page, "usage");

    // A live run: its KV figures, then a cancel that asks first and reads as one.
    await page.goto(`${base}/runs/${cfg.liveId}`);
    await page.getByRole("heading", { level: 1, name: /^Run / }).waitFor({ timeout: T });
    writeFileSync(cfg.readyFile, "ready");
    await page.waitForFunction(() => Number(document.querySelector('[data-testid="token-count"]')?.textContent) >= 3, null, { timeout: 30000 });
    out.kvRunPages = ((await page.getByTestId("kv-run-pages").textContent()) ?? "").trim();
    out.kvTenantDevice = ((await page.getByTestId("kv-tenant-device").textContent()) ?? "").trim();
    out.kvTenantHost = ((await page.getByTestId("kv-tenant-host").textContent()) ?? "").trim();
    out.kvPanelText = (await page.getByRole("region", { name: "KV usage" }).textContent()) ?? "";
    await page.getByRole("button", { name: "Cancel run" }).click();
    await page.getByRole("button", { name: "Cancel now" }).waitFor({ timeout: T });
    await page.waitForTimeout(500);
    out.statusWhileAsking = ((await page.getByTestId("run-status").textContent()) ?? "").trim();
    await page.getByRole("button", { name: "Cancel now" }).click();
    await page.getByTestId("run-status").filter({ hasText: "cancelled" }).waitFor({ timeout: T });
    writeFileSync(cfg.cancelledFile, "cancelled"); // the executor's late outcome, with its error
    await page.getByTestId("run-stdout").filter({ hasText: cfg.stdout }).waitFor({ timeout: 10000 });
    await page.getByTestId("exit-code").filter({ hasText: "-15" }).waitFor({ timeout: 15000 }); // the outcome is in
    out.cancelledNotice = ((await page.getByTestId("run-cancelled").textContent({ timeout: T })) ?? "").trim();
    out.cancelledErrors = await page.getByTestId("run-error").count();
    out.cancelledAlerts = await page.locator('[role="alert"]').count();
    await shot(page, "run-cancelled");
    await page.reload();
    out.cancelledNoticeReloaded = ((await page.getByTestId("run-cancelled").textContent({ timeout: T })) ?? "").trim();
    out.cancelledPageText = (await page.locator("main").textContent()) ?? "";

    // The session ends while the console is open: moving to another page asks to sign in
    // again over it, and the page loads once signed in.
    const dropSession = async () => {
      const keep = (await page.context().cookies()).filter((c) => c.name !== "sessionid");
      await page.context().clearCookies();
      await page.context().addCookies(keep);
    };
    await gotoNav(page, "API keys"); // a page that polls nothing: the next request is the move
    await dropSession();
    await gotoNav(page, "Runs");
    const dialog = page.getByRole("alertdialog");
    await dialog.waitFor({ timeout: T });
    out.expiredDialog = ((await dialog.getByRole("heading").textContent()) ?? "").trim();
    out.expiredBanner = ((await page.locator("main .banner-error").first().textContent({ timeout: T })) ?? "").trim();
    out.expiredRetry = await page.locator("main").getByRole("button", { name: "Retry" }).count();
    out.expiredHeader = ((await page.locator(".user-email").textContent()) ?? "").trim();
    await dialog.getByLabel("Password").fill(cfg.password);
    await dialog.getByRole("button", { name: "Sign in" }).click();
    await dialog.waitFor({ state: "detached", timeout: T });
    await page.getByRole("table", { name: "Runs" }).waitFor({ timeout: T });
    out.runsAfterRenew = await page.getByRole("table", { name: "Runs" }).locator("tbody tr").count();

    // ...and in the middle of a form: it is still filled in after signing in, on the same page.
    await gotoNav(page, "API keys");
    await page.getByLabel("Name", { exact: true }).fill("written-before-expiry");
    await page.getByRole("checkbox", { name: "runs", exact: true }).uncheck();
    await dropSession();
    await page.getByRole("button", { name: "Create key" }).click();
    await dialog.waitFor({ timeout: T });
    out.formBanner = ((await page.locator("main .banner-error").first().textContent({ timeout: T })) ?? "").trim();
    await shot(page, "session-expired");
    const where = page.url();
    await dialog.getByLabel("Password").fill(cfg.password);
    await dialog.getByRole("button", { name: "Sign in" }).click();
    await dialog.waitFor({ state: "detached", timeout: T });
    out.samePage = page.url() === where;
    out.nameKept = await page.getByLabel("Name", { exact: true }).inputValue();
    out.scopeKept = await page.getByRole("checkbox", { name: "runs", exact: true }).isChecked();
    await page.getByRole("button", { name: "Create key" }).click();
    await page.getByTestId("api-key-secret").waitFor({ timeout: T });
    await page.getByRole("button", { name: "I have stored it" }).click();
    // The next key starts from the default scopes and an empty name.
    out.scopesAfterCreate = await page.getByRole("group", { name: "Scopes" }).getByRole("checkbox").evaluateAll((boxes) => boxes.map((b) => b.checked));

    // An uploaded file's docstring describes the program; runs are named after the program and
    // their first argument, or as the run form says.
    await gotoNav(page, "Programs");
    await uploadProgram(page, cfg.docProgram, cfg.docSource);
    out.programLede = ((await page.locator(".lede").first().textContent()) ?? "").trim();
    await page.getByLabel(/Arguments/).fill(JSON.stringify({ who: "Ada Lovelace", times: 2 }));
    await page.getByRole("button", { name: "Run program" }).click();
    await page.getByTestId("run-title-name").waitFor({ timeout: T });
    out.defaultName = ((await page.getByTestId("run-title-name").textContent()) ?? "").trim();
    await page.goBack();
    await page.getByRole("heading", { level: 1, name: cfg.docProgram }).waitFor({ timeout: T });
    await page.getByLabel("Run name (optional)").fill("nightly check");
    await page.getByRole("button", { name: "Run program" }).click();
    await page.getByTestId("run-title-name").filter({ hasText: "nightly check" }).waitFor({ timeout: T });
    out.givenName = ((await page.getByTestId("run-title-name").textContent()) ?? "").trim();
    await gotoNav(page, "Runs");
    await page.getByTestId("run-name").first().waitFor({ timeout: T });
    out.listNames = await page.getByTestId("run-name").allTextContents();
    await shot(page, "runs");

    // Phones: no page scrolls sideways.
    await page.setViewportSize({ width: 390, height: 844 });
    out.widths = {};
    for (const path of cfg.pages) {
      await page.goto(`${base}${path}`);
      await page.getByRole("heading", { level: 1 }).first().waitFor({ timeout: T });
      await page.waitForLoadState("networkidle");
      await page.waitForTimeout(300);
      out.widths[path] = await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
      if (path === "/usage") await shot(page, "usage-mobile");
    }
    return out;
  },

  /** "Try an example" on an empty tenant, then Run: the example's text arrives piece by piece. */
  async tryExample(page) {
    const out = {};
    await login(page, cfg.email, cfg.password);
    await page.getByRole("button", { name: "Try an example" }).first().click();
    await page.getByRole("heading", { level: 1, name: "completion-example" }).waitFor({ timeout: T });
    await page.getByRole("button", { name: "Run program" }).click();
    await page.getByRole("heading", { level: 1, name: /^Run / }).waitFor({ timeout: T });
    const counts = new Set();
    const deadline = Date.now() + (cfg.runTimeoutMs ?? 180000);
    while (Date.now() < deadline) {
      const status = (await page.getByTestId("run-status").textContent()) ?? "";
      const count = Number((await page.getByTestId("token-count").textContent()) ?? "0");
      if (count > 0 && !/succeeded|failed|timed out|cancelled/.test(status)) counts.add(count);
      if (/succeeded|failed|timed out|cancelled/.test(status)) {
        out.status = status.trim();
        break;
      }
      await page.waitForTimeout(50);
    }
    out.countsWhileRunning = [...counts];
    out.chunks = Number((await page.getByTestId("token-count").textContent()) ?? "0");
    out.text = await page.getByTestId("token-stream").textContent();
    await shot(page, "run-example-streamed");
    return out;
  },

  /** A real run that sleeps between two generations: once it has ended, the run page's trace
   * waterfall ranks the sleep as the slowest operation with the longest bar of them, zooms to a
   * span on a click (and from the keyboard), resets, links the Chrome format and fits a phone. */
  async traceWaterfall(page) {
    const out = {};
    await login(page, cfg.email, cfg.password);
    await page.getByRole("link", { name: cfg.programName }).click();
    await page.getByRole("heading", { level: 1, name: cfg.programName }).waitFor({ timeout: T });
    await page.getByRole("button", { name: "Run program" }).click();
    await page.getByRole("heading", { level: 1, name: /^Run / }).waitFor({ timeout: T });
    out.runId = page.url().split("/runs/")[1];
    const card = page.getByTestId("trace");
    out.whileRunning = (await card.textContent()) ?? "";
    const deadline = Date.now() + (cfg.runTimeoutMs ?? 180000);
    while (Date.now() < deadline) {
      const status = (await page.getByTestId("run-status").textContent()) ?? "";
      if (/succeeded|failed|timed out|cancelled/.test(status)) {
        out.status = status.trim();
        break;
      }
      await page.waitForTimeout(100);
    }
    const rows = page.getByTestId("trace-rows");
    await rows.waitFor({ timeout: T });
    // Bars of the program's operations, by name and pixel width, widest first.
    const operationBars = () =>
      rows.evaluate((list) =>
        Array.from(list.querySelectorAll("li"))
          .filter((li) => ["syscall", "io", "wait", "kv_move"].includes(li.dataset.kind))
          .map((li) => ({ name: li.dataset.span, rank: li.dataset.slowRank ?? null, width: li.querySelector(".wf-bar").getBoundingClientRect().width }))
          .sort((a, b) => b.width - a.width),
      );
    out.bars = await operationBars();
    out.slowest = await rows.locator('li[data-slow-rank="1"]').getAttribute("data-span");
    out.slowestText = (await page.getByTestId("trace-slowest").textContent()) ?? "";
    out.rowsWhole = await rows.locator("li").count();
    await shot(page, "run-trace");

    // Zoom by clicking the sleep: the axis spans it, its bar fills the track, fewer rows remain.
    const sleepRow = rows.locator('li[data-span="sleep"]').first();
    await sleepRow.getByRole("button").click();
    out.zoomedLabel = (await page.getByTestId("trace-window").textContent()) ?? "";
    out.sleepFill = await sleepRow.evaluate((li) => li.querySelector(".wf-bar").getBoundingClientRect().width / li.querySelector(".wf-track").getBoundingClientRect().width);
    out.rowsZoomed = await rows.locator("li").count();
    await page.getByRole("button", { name: "Show the whole run" }).click();
    out.rowsReset = await rows.locator("li").count();
    out.resetLabel = (await page.getByTestId("trace-window").textContent()) ?? "";

    // From the keyboard: Tab reaches a row, arrows move, Enter zooms, Escape resets.
    const first = rows.getByRole("button").first();
    await first.focus();
    await page.keyboard.press("ArrowDown");
    out.focusedAfterArrow = await page.evaluate(() => document.activeElement?.closest("li")?.dataset.span ?? null);
    await page.keyboard.press("Enter");
    out.keyboardZoom = (await page.getByTestId("trace-window").textContent()) ?? "";
    await page.keyboard.press("Escape");
    out.keyboardReset = (await page.getByTestId("trace-window").textContent()) ?? "";

    // The download is the Chrome trace-event JSON Perfetto opens.
    const link = page.getByTestId("trace-download");
    out.downloadText = (await link.textContent()) ?? "";
    out.downloadHref = await link.getAttribute("href");
    const [download] = await Promise.all([page.waitForEvent("download", { timeout: T }), link.click()]);
    out.downloadName = download.suggestedFilename();
    const body = JSON.parse(readFileSync(await download.path(), "utf8"));
    out.chrome = { events: body.traceEvents.length, sleep: body.traceEvents.some((e) => e.name === "sleep"), unit: body.displayTimeUnit };

    await card.scrollIntoViewIfNeeded();
    await atPhoneWidth(page, "run page with its trace", "run-trace-mobile");
    await page.setViewportSize({ width: 390, height: 844 });
    await withinWidth(page, sleepRow.locator(".wf-track"), "the sleep's track");
    await page.setViewportSize({ width: 1280, height: 800 });
    return out;
  },
};

// A persistent context is how Playwright takes a fresh --user-data-dir (a new temp dir per run).
const context = await chromium.launchPersistentContext(cfg.userDataDir, {
  executablePath: cfg.chromium ?? "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1280, height: 800 },
  baseURL: base,
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
let result;
const page = await context.newPage();
// Every Content-Security-Policy violation of every page a scenario visits, for the checks below.
await page.addInitScript(() => {
  window.__cspViolations = [];
  document.addEventListener("securitypolicyviolation", (e) =>
    window.__cspViolations.push({ directive: e.effectiveDirective, blocked: e.blockedURI, source: e.sourceFile }),
  );
});
const consoleErrors = [];
page.on("console", (m) => m.type() === "error" && consoleErrors.push(m.text()));
page.on("pageerror", (e) => consoleErrors.push(String(e)));
try {
  const fn = scenarios[scenarioName];
  if (!fn) throw new Error(`unknown scenario ${scenarioName}`);
  result = { ok: true, ...(await fn(page)), consoleErrors };
  // A page the policy broke says so in the console; only the csp scenario provokes that on purpose.
  const refused = consoleErrors.filter((m) => m.includes("Content Security Policy"));
  if (scenarioName !== "csp" && refused.length) throw new Error(`Content-Security-Policy refused: ${refused.join(" | ")}`);
} catch (err) {
  if (cfg.artifacts) {
    mkdirSync(cfg.artifacts, { recursive: true });
    await page.screenshot({ path: path.join(cfg.artifacts, `${scenarioName}-failure.png`), fullPage: true }).catch(() => {});
    writeFileSync(path.join(cfg.artifacts, `${scenarioName}-failure.html`), await page.content().catch(() => ""));
  }
  result = { ok: false, error: String(err?.stack ?? err), url: page.url(), consoleErrors };
} finally {
  await context.close();
}
console.log(JSON.stringify(result));
process.exit(result.ok ? 0 : 1);
