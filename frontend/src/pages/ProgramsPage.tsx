import { useState, type FormEvent } from "react";
import { Link, useNavigate } from "react-router";
import { listPrograms, uploadProgram } from "../api/endpoints";
import { ApiError, fieldError } from "../api/errors";
import type { Program } from "../api/types";
import { FileDrop } from "../components/FileDrop";
import { PageHeader } from "../components/PageHeader";
import { AsyncBlock, Empty, ErrorBanner, FieldError } from "../components/Status";
import { useAsync } from "../hooks/useAsync";
import { useUploadLimit } from "../hooks/useUploadLimit";
import { uploadExample } from "../lib/example";
import { formatDate } from "../lib/format";

/** Uploads the example LIP and opens its page, where the run form has its arguments filled in. */
function TryExampleButton({ primary = false }: { primary?: boolean }) {
  const navigate = useNavigate();
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  return (
    <>
      <button
        type="button"
        className={primary ? "btn btn-primary" : "btn"}
        disabled={busy}
        onClick={async () => {
          setBusy(true);
          try {
            const program = await uploadExample();
            navigate(`/programs/${program.id}`, { state: { example: true } });
          } catch (err) {
            setError(err);
            setBusy(false);
          }
        }}
      >
        {busy ? "Uploading the example…" : "Try an example"}
      </button>
      <ErrorBanner error={error} />
    </>
  );
}

export function programNameFromFile(file: File): string {
  return file.name.replace(/\.(py|zip)$/i, "").replace(/[^A-Za-z0-9_.-]+/g, "-").slice(0, 100) || "program";
}

function UploadForm({ onUploaded }: { onUploaded: (p: Program) => void }) {
  const [file, setFile] = useState<File | null>(null);
  const [name, setName] = useState("");
  const [description, setDescription] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const maxBytes = useUploadLimit();
  // A program the server refused (syntax, no main, a bad zip) is about the file.
  const fileError = error instanceof ApiError && error.code === "invalid_program" ? error.message : fieldError(error, "file");
  const nameError = fieldError(error, "name");
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    if (!file) {
      setError(new Error("Choose a .py or .zip file first"));
      return;
    }
    setBusy(true);
    try {
      const program = await uploadProgram(file, name || programNameFromFile(file), description);
      setFile(null);
      setName("");
      setDescription("");
      setError(null);
      onUploaded(program);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return (
    <form className="card form" onSubmit={submit} aria-labelledby="upload-title">
      <h2 id="upload-title">Upload a program</h2>
      {!fileError && <ErrorBanner error={error} inline />}
      <FileDrop
        file={file}
        maxBytes={maxBytes}
        error={fileError}
        onFile={(f) => {
          setFile(f);
          if (f && !name) setName(programNameFromFile(f));
        }}
      />
      <div className="row">
        <label className="field">
          Name
          <input
            type="text"
            value={name}
            required
            maxLength={100}
            aria-invalid={nameError ? true : undefined}
            aria-describedby="program-name-error"
            onChange={(e) => setName(e.target.value)}
          />
          <FieldError id="program-name-error" message={nameError} />
        </label>
        <label className="field grow">
          Description
          <input type="text" value={description} onChange={(e) => setDescription(e.target.value)} />
        </label>
      </div>
      <button className="btn btn-primary" type="submit" disabled={busy}>
        {busy ? "Uploading…" : "Upload"}
      </button>
    </form>
  );
}

function ProgramTable({ programs }: { programs: Program[] }) {
  if (!programs.length)
    return (
      <Empty>
        No programs yet. Try the example: it uploads a small completion program and opens its run form, ready to run. Or
        upload your own LIP above: a .py with <code>main(args)</code>, or a zip.
        <span className="empty-actions">
          <TryExampleButton primary />
        </span>
      </Empty>
    );
  return (
    <div className="table-wrap">
      <table>
        <caption className="visually-hidden">Programs</caption>
        <thead>
          <tr>
            <th scope="col">Name</th>
            <th scope="col">Description</th>
            <th scope="col">Latest version</th>
            <th scope="col">Created</th>
          </tr>
        </thead>
        <tbody>
          {programs.map((p) => (
            <tr key={p.id}>
              <td>
                <Link to={`/programs/${p.id}`} className="truncate" title={p.name}>
                  {p.name}
                </Link>
              </td>
              <td>{p.description || "—"}</td>
              <td>v{p.latest_version ?? "—"}</td>
              <td>{formatDate(p.created_at)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

export function ProgramsPage() {
  const programs = useAsync(listPrograms);
  const navigate = useNavigate();
  return (
    <>
      <PageHeader title="Programs" actions={<TryExampleButton />}>
        LLM inference programs of this tenant. Upload one, then run it.
      </PageHeader>
      <UploadForm
        onUploaded={(p) => {
          programs.reload();
          navigate(`/programs/${p.id}`);
        }}
      />
      <section aria-labelledby="programs-title">
        <h2 id="programs-title">All programs</h2>
        <AsyncBlock state={programs} label="Loading programs…">
          {(list) => <ProgramTable programs={list} />}
        </AsyncBlock>
      </section>
    </>
  );
}
