import { useId, useState, type DragEvent } from "react";
import { formatBytes } from "../lib/format";

interface FileDropProps {
  file: File | null;
  onFile: (file: File | null) => void;
  accept?: string;
  label?: string;
  /** Refuse a larger file here, before it is sent (the server checks again). */
  maxBytes?: number | null;
  /** An error about the file from the server, shown under the zone. */
  error?: string | null;
}

const ACCEPT = ".py,.zip";

export function acceptable(file: File, accept = ACCEPT): boolean {
  const name = file.name.toLowerCase();
  return accept.split(",").some((ext) => name.endsWith(ext.trim()));
}

/** Drag-and-drop zone that is also a plain, labelled file input (keyboard accessible). */
export function FileDrop({ file, onFile, accept = ACCEPT, label = "Program file (.py or .zip)", maxBytes, error }: FileDropProps) {
  const id = useId();
  const [over, setOver] = useState(false);
  const [rejected, setRejected] = useState<string | null>(null);

  const take = (f: File | undefined | null) => {
    if (!f) return;
    if (!acceptable(f, accept)) {
      setRejected(`${f.name} is not a ${accept.replaceAll(",", " or ")} file`);
      onFile(null);
      return;
    }
    if (maxBytes && f.size > maxBytes) {
      setRejected(`${f.name} is ${formatBytes(f.size)}; programs can be at most ${formatBytes(maxBytes)}.`);
      onFile(null);
      return;
    }
    setRejected(null);
    onFile(f);
  };
  const onDrop = (e: DragEvent<HTMLLabelElement>) => {
    e.preventDefault();
    setOver(false);
    take(e.dataTransfer.files[0]);
  };

  return (
    <div className="field">
      <label
        htmlFor={id}
        className={`dropzone${over ? " dropzone-over" : ""}`}
        onDragOver={(e) => {
          e.preventDefault();
          setOver(true);
        }}
        onDragLeave={() => setOver(false)}
        onDrop={onDrop}
        data-testid="dropzone"
      >
        <span className="dropzone-title">{label}</span>
        <span className="dropzone-hint">
          {file
            ? `Selected: ${file.name} (${file.size} bytes)`
            : `Drop a file here or click to choose${maxBytes ? ` (up to ${formatBytes(maxBytes)})` : ""}`}
        </span>
      </label>
      <input
        id={id}
        className="visually-hidden-file"
        type="file"
        accept={accept}
        onChange={(e) => take(e.target.files?.[0])}
      />
      {(rejected || error) && (
        <p className="field-error" role="alert" data-testid="file-error">
          {rejected ?? error}
        </p>
      )}
    </div>
  );
}
