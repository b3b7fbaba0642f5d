import { createContext, useCallback, useContext, useEffect, useMemo, useRef, useState, type ReactNode } from "react";
import * as api from "../api/endpoints";
import type { Me, TenantRef } from "../api/types";
import { onSessionExpired, reportSessionRenewed } from "./sessionExpiry";

export interface AuthValue {
  me: Me | null;
  loading: boolean;
  error: unknown;
  activeTenant: TenantRef | undefined;
  isStaff: boolean;
  /** The session ran out while signed in: the console asks to sign in again over the page. */
  expired: boolean;
  /** Sign in again after `expired`; the page underneath stays as it was. */
  renewSession: (email: string, password: string) => Promise<void>;
  login: (email: string, password: string) => Promise<void>;
  signup: (email: string, password: string, tenantName: string) => Promise<void>;
  /** Sign up through an invitation token: the new user joins its tenant. */
  signupWithInvite: (email: string, password: string, invite: string) => Promise<void>;
  /** Join the invitation's tenant as the signed-in user; it becomes the active tenant. */
  acceptInvitation: (token: string) => Promise<void>;
  /** Create a tenant owned by the signed-in user and switch to it. */
  createTenant: (name: string) => Promise<void>;
  /** Close a tenant the user owns (`confirm`: its slug); the console moves to another or none. */
  closeTenant: (id: number, confirm: string) => Promise<void>;
  logout: () => Promise<void>;
  switchTenant: (id: number) => Promise<void>;
  refresh: () => Promise<void>;
}

const AuthContext = createContext<AuthValue | null>(null);

export function AuthProvider({ children }: { children: ReactNode }) {
  const [me, setMe] = useState<Me | null>(null);
  const [loading, setLoading] = useState(true);
  const [error, setError] = useState<unknown>(null);
  const [expired, setExpired] = useState(false);
  const signedIn = useRef(false);
  signedIn.current = me !== null;

  // Refusals before sign-in (the first /auth/me, the login page) are not an expiry.
  useEffect(() => onSessionExpired(() => signedIn.current && setExpired(true)), []);

  const refresh = useCallback(async () => {
    try {
      setMe(await api.getMe());
      setError(null);
    } catch (err) {
      setError(err);
    } finally {
      setLoading(false);
    }
  }, []);

  useEffect(() => {
    void refresh();
  }, [refresh]);

  const value = useMemo<AuthValue>(
    () => ({
      me,
      loading,
      error,
      activeTenant: me?.tenants.find((t) => t.id === me.active_tenant),
      isStaff: Boolean(me?.user?.is_staff),
      expired,
      renewSession: async (email, password) => {
        setMe(await api.login(email, password));
        setExpired(false);
        reportSessionRenewed();
      },
      login: async (email, password) => setMe(await api.login(email, password)),
      signup: async (email, password, tenantName) => setMe(await api.signup(email, password, tenantName)),
      // These answer with the /auth/me body, so the new membership shows without a refetch.
      signupWithInvite: async (email, password, invite) => setMe(await api.signupWithInvite(email, password, invite)),
      acceptInvitation: async (token) => setMe(await api.acceptInvitation(token)),
      createTenant: async (name) => setMe(await api.createTenant(name)),
      closeTenant: async (id, confirm) => setMe(await api.closeTenant(id, confirm)),
      logout: async () => {
        try {
          await api.logout();
        } finally {
          // An ended session is signed out whatever the server answered.
          setMe(null);
          setExpired(false);
        }
      },
      switchTenant: async (id) => setMe(await api.switchTenant(id)),
      refresh,
    }),
    [me, loading, error, expired, refresh],
  );
  return <AuthContext.Provider value={value}>{children}</AuthContext.Provider>;
}

export function useAuth(): AuthValue {
  const value = useContext(AuthContext);
  if (!value) throw new Error("useAuth outside AuthProvider");
  return value;
}

/** For tests and stories: provide a fixed auth value. */
export const AuthContextProvider = AuthContext.Provider;
