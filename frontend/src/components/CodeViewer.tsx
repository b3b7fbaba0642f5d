/** Read-only source with line numbers. */
export function CodeViewer({ code, label }: { code: string; label: string }) {
  const lines = code.replace(/\n$/, "").split("\n");
  return (
    <figure className="code" aria-label={label}>
      <pre tabIndex={0}>
        <code>
          {lines.map((line, i) => (
            <span className="code-line" key={i}>
              <span className="code-ln" aria-hidden="true">
                {i + 1}
              </span>
              {line || " "}
              {"\n"}
            </span>
          ))}
        </code>
      </pre>
    </figure>
  );
}
