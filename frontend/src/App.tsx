import type { ReactNode } from "react";
import { Navigate, Route, Routes, useLocation } from "react-router";
import { useAuth } from "./auth/AuthContext";
import { Layout } from "./components/Layout";
import { ErrorBanner, Loading } from "./components/Status";
import { AccountPage } from "./pages/AccountPage";
import { AdminPage } from "./pages/AdminPage";
import { ApiKeysPage } from "./pages/ApiKeysPage";
import { ConfirmEmailPage } from "./pages/ConfirmEmailPage";
import { LoginPage, SignupPage } from "./pages/AuthPages";
import { ForgotPasswordPage, ResetPasswordPage } from "./pages/PasswordResetPages";
import { InvitePage } from "./pages/InvitePage";
import { KVFilesPage } from "./pages/KVFilesPage";
import { ProgramDetailPage } from "./pages/ProgramDetailPage";
import { ProgramsPage } from "./pages/ProgramsPage";
import { RunPage } from "./pages/RunPage";
import { RunsPage } from "./pages/RunsPage";
import { TeamPage } from "./pages/TeamPage";
import { UsagePage } from "./pages/UsagePage";
import { VerifyEmailPage } from "./pages/VerifyEmailPage";

function RequireAuth({ children }: { children: ReactNode }) {
  const { me, loading, error, refresh } = useAuth();
  const location = useLocation();
  if (loading) return <Loading label="Loading console…" />;
  if (error && !me) return <ErrorBanner error={error} onRetry={() => void refresh()} />;
  if (!me) return <Navigate to="/login" replace state={{ from: location.pathname }} />;
  return <>{children}</>;
}

function NotFound() {
  return (
    <>
      <h1>Not found</h1>
      <p>There is no page at this address.</p>
    </>
  );
}

export function App() {
  return (
    <Routes>
      <Route path="/login" element={<LoginPage />} />
      <Route path="/signup" element={<SignupPage />} />
      {/* Public like /login: the reset mail's link is opened signed out. */}
      <Route path="/forgot-password" element={<ForgotPasswordPage />} />
      <Route path="/reset-password/:uid/:token" element={<ResetPasswordPage />} />
      {/* The new address's confirmation link: may be opened signed out (another device) or in. */}
      <Route path="/confirm-email/:token" element={<ConfirmEmailPage />} />
      {/* The sign-up's verification link: likewise signed out or in. */}
      <Route path="/verify-email/:token" element={<VerifyEmailPage />} />
      {/* Outside RequireAuth: an invite link works signed out (sign up) as well as signed in. */}
      <Route path="/invite/:token" element={<InvitePage />} />
      <Route
        element={
          <RequireAuth>
            <Layout />
          </RequireAuth>
        }
      >
        <Route index element={<Navigate to="/programs" replace />} />
        <Route path="/programs" element={<ProgramsPage />} />
        <Route path="/programs/:id" element={<ProgramDetailPage />} />
        <Route path="/runs" element={<RunsPage />} />
        <Route path="/runs/:id" element={<RunPage />} />
        <Route path="/kv-files" element={<KVFilesPage />} />
        <Route path="/usage" element={<UsagePage />} />
        <Route path="/api-keys" element={<ApiKeysPage />} />
        <Route path="/team" element={<TeamPage />} />
        <Route path="/account" element={<AccountPage />} />
        <Route path="/staff" element={<AdminPage />} />
        <Route path="*" element={<NotFound />} />
      </Route>
    </Routes>
  );
}
