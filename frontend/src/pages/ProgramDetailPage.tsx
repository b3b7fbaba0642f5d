import { useEffect, useId, useState, type FormEvent } from "react";
import { Link, useLocation, useNavigate, useParams } from "react-router";
import { ApiError, fieldError } from "../api/errors";
import { createRun, deleteProgram, getProgram, getSource, listRuns, listVersions, sourceUrl, uploadVersion } from "../api/endpoints";
import type { Program, ProgramVersion } from "../api/types";
import { CodeViewer } from "../components/CodeViewer";
import { ConfirmButton } from "../components/ConfirmButton";
import { FileDrop } from "../components/FileDrop";
import { PageHeader } from "../components/PageHeader";
import { AsyncBlock, ErrorBanner, FieldError, Loading, Notice } from "../components/Status";
import { useUploadLimit } from "../hooks/useUploadLimit";
import { useAsync } from "../hooks/useAsync";
import { formatBytes, formatDate } from "../lib/format";
import { hasActiveRuns, RunTable, usePolling } from "./RunsPage";

export function parseJsonObject(text: string): Record<string, unknown> {
  const trimmed = text.trim();
  if (!trimmed) return {};
  const value: unknown = JSON.parse(trimmed);
  if (!value || typeof value !== "object" || Array.isArray(value)) throw new Error("must be a JSON object, e.g. {\"prompt\": \"hi\"}");
  return value as Record<string, unknown>;
}

function RunForm({ program, versions }: { program: Program; versions: ProgramVersion[] }) {
  const navigate = useNavigate();
  const argsId = useId();
  const [version, setVersion] = useState<string>("");
  const [args, setArgs] = useState(() => JSON.stringify(program.default_args ?? {}, null, 2));
  const [name, setName] = useState("");
  const [maxTokens, setMaxTokens] = useState("256");
  const [deadline, setDeadline] = useState("60");
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  // Each refusal next to its field, in words ("Max tokens can be at most 4,096 tokens …").
  const argsError = fieldError(error, "args") ?? (error instanceof Error && !(error instanceof ApiError) ? error.message : null);
  const maxTokensError = fieldError(error, "limits", "max_tokens");
  const deadlineError = fieldError(error, "limits", "deadline_s");
  const versionError = fieldError(error, "version");
  const nameError = fieldError(error, "name");
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    let parsed: Record<string, unknown>;
    try {
      parsed = parseJsonObject(args);
    } catch (err) {
      setError(new Error(`Arguments ${err instanceof Error ? err.message : String(err)}`));
      return;
    }
    setBusy(true);
    try {
      const limits: Record<string, unknown> = {};
      if (maxTokens) limits.max_tokens = Number(maxTokens);
      if (deadline) limits.deadline_s = Number(deadline);
      const run = await createRun(program.id, version ? Number(version) : null, parsed, limits, name.trim());
      navigate(`/runs/${run.id}`);
    } catch (err) {
      setError(err);
      setBusy(false);
    }
  };
  return (
    <form className="card form" onSubmit={submit} aria-labelledby="run-title">
      <h2 id="run-title">Run</h2>
      {!argsError && <ErrorBanner error={error} inline />}
      <label className="field">
        Run name (optional)
        <input
          type="text"
          maxLength={200}
          value={name}
          placeholder={`${program.name} and the first argument`}
          aria-invalid={nameError ? true : undefined}
          aria-describedby="run-name-error"
          onChange={(e) => setName(e.target.value)}
        />
        <FieldError id="run-name-error" message={nameError} />
      </label>
      <div className="row">
        <label className="field">
          Version
          <select
            value={version}
            aria-invalid={versionError ? true : undefined}
            aria-describedby="run-version-error"
            onChange={(e) => setVersion(e.target.value)}
          >
            <option value="">latest (v{program.latest_version})</option>
            {versions.map((v) => (
              <option key={v.number} value={v.number}>
                v{v.number}
              </option>
            ))}
          </select>
          <FieldError id="run-version-error" message={versionError} />
        </label>
        <label className="field">
          Max tokens
          <input
            type="number"
            min={1}
            value={maxTokens}
            aria-invalid={maxTokensError ? true : undefined}
            aria-describedby="run-max-tokens-error"
            onChange={(e) => setMaxTokens(e.target.value)}
          />
          <FieldError id="run-max-tokens-error" message={maxTokensError} />
        </label>
        <label className="field">
          Deadline (s)
          <input
            type="number"
            min={1}
            value={deadline}
            aria-invalid={deadlineError ? true : undefined}
            aria-describedby="run-deadline-error"
            onChange={(e) => setDeadline(e.target.value)}
          />
          <FieldError id="run-deadline-error" message={deadlineError} />
        </label>
      </div>
      <div className="field">
        <label htmlFor={argsId}>Arguments (JSON object passed to main(args))</label>
        <textarea
          id={argsId}
          className="mono"
          rows={5}
          value={args}
          aria-invalid={argsError ? true : undefined}
          aria-describedby="run-args-error"
          onChange={(e) => setArgs(e.target.value)}
          spellCheck={false}
        />
        <FieldError id="run-args-error" message={argsError} />
      </div>
      <button type="submit" className="btn btn-primary" disabled={busy}>
        {busy ? "Starting…" : "Run program"}
      </button>
    </form>
  );
}

function SourcePanel({ program, versions }: { program: Program; versions: ProgramVersion[] }) {
  const [selected, setSelected] = useState<number | null>(null);
  const number = selected ?? versions[versions.length - 1]?.number ?? null;
  const version = versions.find((v) => v.number === number);
  const source = useAsync(
    () => (version && version.kind !== "zip" ? getSource(program.id, version.number) : Promise.resolve("")),
    [program.id, version?.number, version?.kind],
  );
  if (!version) return null;
  return (
    <section className="card" aria-labelledby="source-title">
      <div className="card-head">
        <h2 id="source-title">Source</h2>
        <label className="inline-field">
          Version{" "}
          <select value={number ?? ""} onChange={(e) => setSelected(Number(e.target.value))}>
            {versions.map((v) => (
              <option key={v.number} value={v.number}>
                v{v.number}
              </option>
            ))}
          </select>
        </label>
      </div>
      {version.kind === "zip" ? (
        <p>
          Zip archive ({formatBytes(version.size)}). <a href={sourceUrl(program.id, version.number)}>Download</a>
        </p>
      ) : (
        <AsyncBlock state={source} label="Loading source…">
          {(code) => <CodeViewer code={code} label={`Source of ${program.name} v${version.number}`} />}
        </AsyncBlock>
      )}
    </section>
  );
}

function VersionsPanel({ program, versions, onChange }: { program: Program; versions: ProgramVersion[]; onChange: () => void }) {
  const maxBytes = useUploadLimit();
  const [file, setFile] = useState<File | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const upload = async (e: FormEvent) => {
    e.preventDefault();
    if (!file) return setError(new Error("Choose a file first"));
    setBusy(true);
    try {
      await uploadVersion(program.id, file);
      setFile(null);
      setError(null);
      onChange();
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return (
    <section className="card" aria-labelledby="versions-title">
      <h2 id="versions-title">Versions</h2>
      <div className="table-wrap">
        <table>
          <thead>
            <tr>
              <th scope="col">Version</th>
              <th scope="col">Kind</th>
              <th scope="col">Size</th>
              <th scope="col">SHA-256</th>
              <th scope="col">Uploaded</th>
            </tr>
          </thead>
          <tbody>
            {[...versions].reverse().map((v) => (
              <tr key={v.number}>
                <td>v{v.number}</td>
                <td>{v.kind}</td>
                <td>{formatBytes(v.size)}</td>
                <td className="mono" title={v.sha256}>{v.sha256.slice(0, 12)}…</td>
                <td>{formatDate(v.created_at)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      <form className="form" onSubmit={upload}>
        <ErrorBanner error={error} />
        <FileDrop file={file} onFile={setFile} label="New version (.py or .zip)" maxBytes={maxBytes} />
        <button className="btn" type="submit" disabled={busy || !file}>
          {busy ? "Uploading…" : "Upload new version"}
        </button>
      </form>
    </section>
  );
}

export function ProgramDetailPage() {
  const id = Number(useParams().id);
  const navigate = useNavigate();
  const program = useAsync(() => getProgram(id), [id]);
  const versions = useAsync(() => listVersions(id), [id]);
  const runs = useAsync(() => listRuns(id), [id]);
  usePolling(runs.reload, hasActiveRuns(runs.data));
  const [deleteError, setDeleteError] = useState<unknown>(null);
  const fromExample = Boolean((useLocation().state as { example?: boolean } | null)?.example);
  useEffect(() => setDeleteError(null), [id]);
  const reloadAll = () => {
    program.reload();
    versions.reload();
  };
  return (
    <AsyncBlock state={program} label="Loading program…">
      {(p) => (
        <>
          <PageHeader
            title={p.name}
            actions={
              <ConfirmButton
                confirmLabel="Delete it and its runs"
                onConfirm={async () => {
                  try {
                    await deleteProgram(p.id);
                    navigate("/programs");
                  } catch (err) {
                    setDeleteError(err);
                  }
                }}
              >
                Delete
              </ConfirmButton>
            }
          >
            {p.description || "No description."} <Link to="/programs">All programs</Link>
          </PageHeader>
          <ErrorBanner error={deleteError} />
          {fromExample && (
            <Notice tone="ok">
              This is the example program, with its example arguments filled in below. Press Run program to watch it stream.
            </Notice>
          )}
          {versions.data ? (
            <div className="grid-2">
              <RunForm program={p} versions={versions.data} />
              <VersionsPanel program={p} versions={versions.data} onChange={reloadAll} />
            </div>
          ) : versions.error ? (
            <ErrorBanner error={versions.error} onRetry={versions.reload} />
          ) : (
            <Loading label="Loading versions…" />
          )}
          {versions.data && <SourcePanel program={p} versions={versions.data} />}
          <section aria-labelledby="runs-title">
            <h2 id="runs-title">Recent runs</h2>
            <AsyncBlock state={runs} label="Loading runs…">
              {(list) => <RunTable runs={list} />}
            </AsyncBlock>
          </section>
        </>
      )}
    </AsyncBlock>
  );
}
