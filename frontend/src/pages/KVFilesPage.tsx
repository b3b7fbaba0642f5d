import { useEffect, useState } from "react";
import { KV_PAGE_SIZE, deleteKVFile, listKVFiles, pinKVFile } from "../api/endpoints";
import type { KVFile } from "../api/types";
import { ConfirmButton } from "../components/ConfirmButton";
import { KVFileTable } from "../components/KVFileTable";
import { PageHeader } from "../components/PageHeader";
import { AsyncBlock, ErrorBanner, Notice } from "../components/Status";
import { useAsync } from "../hooks/useAsync";

export function KVFilesPage() {
  const [offset, setOffset] = useState(0);
  const listing = useAsync(() => listKVFiles(offset), [offset]);
  // Deleting the last file of the last page leaves it empty: go back to the page before.
  const emptyPage = listing.data !== undefined && listing.data.files.length === 0 && offset > 0;
  useEffect(() => {
    if (emptyPage) setOffset((o) => Math.max(0, o - KV_PAGE_SIZE));
  }, [emptyPage]);
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
        {({ files, stale, count }) => (
          <>
            {stale && <Notice tone="warn">The GPU worker is unreachable: showing the last known state.</Notice>}
            {(count > KV_PAGE_SIZE || offset > 0) && (
              <nav className="pager" aria-label="KV file pages">
                <button type="button" className="btn btn-small" disabled={offset === 0} onClick={() => setOffset(Math.max(0, offset - KV_PAGE_SIZE))}>
                  Previous
                </button>
                <span>
                  Files {offset + 1}–{offset + files.length} of {count}
                </span>
                <button
                  type="button"
                  className="btn btn-small"
                  disabled={offset + files.length >= count}
                  onClick={() => setOffset(offset + KV_PAGE_SIZE)}
                >
                  Next
                </button>
              </nav>
            )}
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
