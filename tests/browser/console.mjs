// Drives Debian's /usr/bin/chromium through playwright-core (npm, no browser download) against a
// running Symphony server. Invoked by tests/browser/test_console.py:
//
//   node tests/browser/console.mjs <scenario> '<json config>'
//
// Prints one JSON line {"ok": true, ...} (or {"ok": false, "error": ...}) last; writes
// screenshots to config.shots (and a failure screenshot to config.artifacts).
import { createRequire } from "node:module";
import { mkdirSync, writeFileSync } from "node:fs";
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
}

async function login(page, email, password) {
  await page.goto(`${base}/login`);
  await page.getByLabel("Email").fill(email);
  await page.getByLabel("Password").fill(password);
  await page.getByRole("button", { name: "Log in" }).click();
  await page.getByRole("heading", { level: 1, name: "Programs" }).waitFor({ timeout: T });
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

    // Non-staff: no Admin link; /admin bounces to Programs.
    check((await page.getByRole("link", { name: "Admin" }).count()) === 0, "no Admin link for a tenant user");

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
    await page.getByLabel("Email").fill(cfg.email);
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
    await page.getByLabel("Email").fill(cfg.email);
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
    await gotoNav(page, "Admin");
    await page.getByRole("heading", { name: "Tenants" }).waitFor({ timeout: T });
    for (const slug of cfg.expectTenants ?? []) await page.getByRole("cell", { name: new RegExp(slug) }).first().waitFor({ timeout: T });
    await page.getByRole("heading", { name: "All KV files" }).waitFor();
    await page.getByRole("heading", { name: "Worker health" }).waitFor();
    await page.getByText(/Control plane:/).waitFor({ timeout: T });
    return {};
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

    await gotoNav(page, "Admin");
    await page.getByRole("button", { name: `Evict ${cfg.kvTenant}/${cfg.kvName}` }).waitFor({ timeout: T });
    await shot(page, "admin");
    return out;
  },

  async evict(page) {
    await login(page, cfg.email, cfg.password);
    await gotoNav(page, "Admin");
    const label = `Evict ${cfg.kvTenant}/${cfg.kvName}`;
    await page.getByRole("button", { name: label }).click();
    await page.getByRole("button", { name: "Evict now" }).click();
    await page.getByText(`Evicted ${cfg.kvTenant}/${cfg.kvName}`).waitFor({ timeout: T });
    return {};
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
const consoleErrors = [];
page.on("console", (m) => m.type() === "error" && consoleErrors.push(m.text()));
page.on("pageerror", (e) => consoleErrors.push(String(e)));
try {
  const fn = scenarios[scenarioName];
  if (!fn) throw new Error(`unknown scenario ${scenarioName}`);
  result = { ok: true, ...(await fn(page)), consoleErrors };
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
