import { useState, type FormEvent } from "react";
import { Link, useNavigate } from "react-router";
import { listPrograms, uploadProgram } from "../api/endpoints";
import type { Program } from "../api/types";
import { FileDrop } from "../components/FileDrop";
import { PageHeader } from "../components/PageHeader";
import { AsyncBlock, Empty, ErrorBanner } from "../components/Status";
import { useAsync } from "../hooks/useAsync";
import { formatDate } from "../lib/format";

export function programNameFromFile(file: File): string {
  return file.name.replace(/\.(py|zip)$/i, "").replace(/[^A-Za-z0-9_.-]+/g, "-").slice(0, 100) || "program";
}

function UploadForm({ onUploaded }: { onUploaded: (p: Program) => void }) {
  const [file, setFile] = useState<File | null>(null);
  const [name, setName] = useState("");
  const [description, setDescription] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
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
      <ErrorBanner error={error} />
      <FileDrop
        file={file}
        onFile={(f) => {
          setFile(f);
          if (f && !name) setName(programNameFromFile(f));
        }}
      />
      <div className="row">
        <label className="field">
          Name
          <input type="text" value={name} required maxLength={100} onChange={(e) => setName(e.target.value)} />
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
  if (!programs.length) return <Empty>No programs yet. Upload a LIP (a .py with main(args), or a zip).</Empty>;
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
                <Link to={`/programs/${p.id}`}>{p.name}</Link>
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
      <PageHeader title="Programs">LLM inference programs of this tenant. Upload one, then run it.</PageHeader>
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
