import { useState } from "react";
import { NavLink, Outlet, useNavigate } from "react-router";
import { useAuth } from "../auth/AuthContext";
import { TenantSwitcher } from "./TenantSwitcher";

const LINKS = [
  { to: "/programs", label: "Programs" },
  { to: "/runs", label: "Runs" },
  { to: "/kv-files", label: "KV files" },
  { to: "/usage", label: "Usage & billing" },
  { to: "/api-keys", label: "API keys" },
];

export function Layout() {
  const { me, isStaff, logout, activeTenant } = useAuth();
  const navigate = useNavigate();
  const [open, setOpen] = useState(false);
  const links = isStaff ? [...LINKS, { to: "/admin", label: "Admin" }] : LINKS;
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
            {me?.user?.email}
          </span>
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
        <Outlet />
      </main>
    </div>
  );
}
