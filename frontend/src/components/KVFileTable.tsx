import type { ReactNode } from "react";
import type { KVFile } from "../api/types";
import { formatBytes, formatDate, formatNumber } from "../lib/format";
import { Empty } from "./Status";

interface KVFileTableProps {
  files: KVFile[];
  showTenant?: boolean;
  actions: (file: KVFile) => ReactNode;
  caption: string;
}

export function KVFileTable({ files, showTenant = false, actions, caption }: KVFileTableProps) {
  if (!files.length)
    return (
      <Empty>
        No persistent KV files. A run keeps one when its program names it, <code>kv_create("name")</code>, and does not
        delete it; the next run can open it again with the same name.
      </Empty>
    );
  return (
    <div className="table-wrap">
      <table>
        <caption className="visually-hidden">{caption}</caption>
        <thead>
          <tr>
            {showTenant && <th scope="col">Tenant</th>}
            <th scope="col">Name</th>
            <th scope="col">Tokens</th>
            <th scope="col">Size</th>
            <th scope="col">Residency</th>
            <th scope="col">Pinned</th>
            <th scope="col">Last used</th>
            <th scope="col">
              <span className="visually-hidden">Actions</span>
            </th>
          </tr>
        </thead>
        <tbody>
          {files.map((f) => (
            <tr key={f.id}>
              {showTenant && <td>{f.tenant}</td>}
              <td className="mono">
                <span className="truncate" title={f.name}>
                  {f.name}
                </span>
              </td>
              <td>{formatNumber(f.tokens)}</td>
              <td>{formatBytes(f.bytes)}</td>
              <td>
                <span className={`badge badge-res-${f.residency}`}>{f.residency}</span>
              </td>
              <td>{f.pinned ? "yes" : "no"}</td>
              <td>{formatDate(f.last_used)}</td>
              <td className="actions">{actions(f)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
