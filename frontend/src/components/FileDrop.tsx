import { useId, useState, type DragEvent } from "react";

interface FileDropProps {
  file: File | null;
  onFile: (file: File | null) => void;
  accept?: string;
  label?: string;
}

const ACCEPT = ".py,.zip";

export function acceptable(file: File, accept = ACCEPT): boolean {
  const name = file.name.toLowerCase();
  return accept.split(",").some((ext) => name.endsWith(ext.trim()));
}

/** Drag-and-drop zone that is also a plain, labelled file input (keyboard accessible). */
export function FileDrop({ file, onFile, accept = ACCEPT, label = "Program file (.py or .zip)" }: FileDropProps) {
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
          {file ? `Selected: ${file.name} (${file.size} bytes)` : "Drop a file here or click to choose"}
        </span>
      </label>
      <input
        id={id}
        className="visually-hidden-file"
        type="file"
        accept={accept}
        onChange={(e) => take(e.target.files?.[0])}
      />
      {rejected && (
        <p className="field-error" role="alert">
          {rejected}
        </p>
      )}
    </div>
  );
}
