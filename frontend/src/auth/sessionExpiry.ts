// The session ran out while the console was open: any API call answered `not_authenticated`.
// The HTTP client reports it here; the AuthProvider shows the sign-in dialog over the page (so
// the page and its half-filled forms stay as they were), and once signed in again the blocks
// whose load failed for it reload (components/Status.tsx AsyncBlock).
type Listener = () => void;

const expired = new Set<Listener>();
const renewed = new Set<Listener>();

export function reportSessionExpired(): void {
  for (const listener of [...expired]) listener();
}

export function reportSessionRenewed(): void {
  for (const listener of [...renewed]) listener();
}

export function onSessionExpired(listener: Listener): () => void {
  expired.add(listener);
  return () => void expired.delete(listener);
}

export function onSessionRenewed(listener: Listener): () => void {
  renewed.add(listener);
  return () => void renewed.delete(listener);
}
