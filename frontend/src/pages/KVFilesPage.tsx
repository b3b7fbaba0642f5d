import { useState } from "react";
import { deleteKVFile, listKVFiles, pinKVFile } from "../api/endpoints";
import type { KVFile } from "../api/types";
import { ConfirmButton } from "../components/ConfirmButton";
import { KVFileTable } from "../components/KVFileTable";
import { PageHeader } from "../components/PageHeader";
import { AsyncBlock, ErrorBanner, Notice } from "../components/Status";
import { useAsync } from "../hooks/useAsync";

export function KVFilesPage() {
  const listing = useAsync(listKVFiles);
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState<number | null>(null);
  const act = async (file: KVFile, fn: () => Promise<unknown>) => {
    setBusy(file.id);
    try {
      await fn();
      setError(null);
      listing.reload();
    } catch (err) {
      setError(err);
    } finally {
      setBusy(null);
    }
  };
  return (
    <>
      <PageHeader title="KV files" actions={<button type="button" className="btn" onClick={listing.reload}>Refresh</button>}>
        Persistent KV-cache files of this tenant. Pinned files are never evicted by the worker's policy.
      </PageHeader>
      <ErrorBanner error={error} />
      <AsyncBlock state={listing} label="Loading KV files…">
        {({ files, stale }) => (
          <>
            {stale && <Notice tone="warn">The GPU worker is unreachable: showing the last known state.</Notice>}
            <KVFileTable
              caption="KV files"
              files={files}
              actions={(f) => (
                <>
                  <button
                    type="button"
                    className="btn btn-small"
                    disabled={busy === f.id}
                    aria-label={`${f.pinned ? "Unpin" : "Pin"} ${f.name}`}
                    onClick={() => act(f, () => pinKVFile(f.id, !f.pinned))}
                  >
                    {f.pinned ? "Unpin" : "Pin"}
                  </button>
                  <ConfirmButton ariaLabel={`Delete ${f.name}`} onConfirm={() => act(f, () => deleteKVFile(f.id))}>
                    Delete
                  </ConfirmButton>
                </>
              )}
            />
          </>
        )}
      </AsyncBlock>
    </>
  );
}
