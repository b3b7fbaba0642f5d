import { useEffect, useRef, useState } from "react";
import { Navigate, NavLink, Outlet, useLocation, useNavigate } from "react-router";
import { useAuth } from "../auth/AuthContext";
import { NoTenantPage } from "../pages/NoTenantPage";
import { focusHeadingOnArrival } from "./PageHeader";
import { SessionExpiredDialog } from "./SessionExpiredDialog";
import { TenantSwitcher } from "./TenantSwitcher";
import { VerifyEmailBanner } from "./VerifyEmailBanner";

const LINKS = [
  { to: "/programs", label: "Programs" },
  { to: "/runs", label: "Runs" },
  { to: "/kv-files", label: "KV files" },
  { to: "/usage", label: "Usage & billing" },
  { to: "/api-keys", label: "API keys" },
  { to: "/team", label: "Team" },
];
/** The staff page lives at /staff: /admin is Django's admin, which a reload would open. */
const STAFF_LINK = { to: "/staff", label: "Staff" };
/** Pages that work without an active tenant (the rest are tenant-scoped and would answer 403). */
const TENANTLESS_PATHS = new Set(["/account", "/staff"]);

export function Layout() {
  const { me, isStaff, logout, activeTenant, expired } = useAuth();
  const navigate = useNavigate();
  const { pathname } = useLocation();
  const [open, setOpen] = useState(false);
  // After a move within the console, focus goes to the new page's heading (not the body), so
  // a screen reader announces it and Tab continues from there.
  const firstPath = useRef(pathname);
  useEffect(() => {
    if (pathname !== firstPath.current) focusHeadingOnArrival();
  }, [pathname]);
  // A user removed from (or who left) their last tenant has none: offer to create one instead
  // of tenant pages that could only fail.
  const stranded = me?.active_tenant === null;
  const tenantLinks = stranded ? [] : LINKS;
  const links = isStaff ? [...tenantLinks, STAFF_LINK] : tenantLinks;
  return (
    <div className="shell">
      <a className="skip-link" href="#main">
        Skip to content
      </a>
      <header className="topbar">
        <NavLink to="/programs" className="brand">
          Symphony
        </NavLink>
        <button
          type="button"
          className="btn btn-small nav-toggle"
          aria-expanded={open}
          aria-controls="main-nav"
          onClick={() => setOpen((o) => !o)}
        >
          Menu
        </button>
        <nav id="main-nav" aria-label="Main" className={open ? "nav nav-open" : "nav"}>
          {links.map((l) => (
            <NavLink key={l.to} to={l.to} onClick={() => setOpen(false)}>
              {l.label}
            </NavLink>
          ))}
        </nav>
        <div className="account">
          <TenantSwitcher />
          <span className="user-email" data-tenant={activeTenant?.slug}>
            {expired ? "Session expired" : me?.user?.email}
          </span>
          <NavLink to="/account" className="btn btn-small">
            Account
          </NavLink>
          <button
            type="button"
            className="btn btn-small"
            onClick={async () => {
              await logout();
              navigate("/login");
            }}
          >
            Log out
          </button>
        </div>
      </header>
      <main id="main" className="content" tabIndex={-1}>
        <VerifyEmailBanner />
        {stranded && !TENANTLESS_PATHS.has(pathname) ? (
          // Staff without a tenant (the operator's admin) have the staff page to go to.
          isStaff ? <Navigate to="/staff" replace /> : <NoTenantPage />
        ) : (
          <Outlet />
        )}
      </main>
      {expired && <SessionExpiredDialog />}
    </div>
  );
}
