import { Link } from "react-router";
import { useAuth } from "../auth/AuthContext";
import { PageHeader } from "../components/PageHeader";
import { CreateTenantForm } from "./AccountPage";

/** Shown instead of the tenant pages to a user who belongs to no tenant (they left or were
 * removed from their last one): every tenant route would answer 403 for them. */
export function NoTenantPage() {
  const { me } = useAuth();
  return (
    <>
      <PageHeader title="No tenant">
        You are signed in as {me?.user?.email} but do not belong to any tenant, so there are no programs, runs or keys to show.
      </PageHeader>
      <p>
        Ask an owner of a tenant for an invitation link and open it, or create a tenant of your own below. Your password is on
        the <Link to="/account">Account</Link> page.
      </p>
      <CreateTenantForm />
    </>
  );
}
