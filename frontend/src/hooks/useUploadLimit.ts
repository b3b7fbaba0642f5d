import { useEffect, useState } from "react";
import { getQuota } from "../api/endpoints";

let pending: Promise<number | null> | null = null;

/** The largest program file the server takes (`max_program_bytes` of GET /quota), fetched once
 * per page load; null until known or when the server does not say (the server checks anyway). */
export function useUploadLimit(): number | null {
  const [limit, setLimit] = useState<number | null>(null);
  useEffect(() => {
    pending ??= getQuota().then(
      (q) => q.max_program_bytes ?? null,
      () => {
        pending = null;
        return null;
      },
    );
    let live = true;
    void pending.then((n) => live && setLimit(n));
    return () => {
      live = false;
    };
  }, []);
  return limit;
}
