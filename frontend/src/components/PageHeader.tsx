import { useEffect, useRef, type ReactNode } from "react";

/** Set by the layout when the route changed: the next page heading to appear takes focus. */
let headingWanted = false;
let pendingHeading: HTMLHeadingElement | null = null;

/** Give focus to the page heading that is (or next comes) on screen. */
export function focusHeadingOnArrival(): void {
  if (pendingHeading?.isConnected) {
    pendingHeading.focus();
    return;
  }
  headingWanted = true;
}

export function PageHeader({ title, actions, children }: { title: string; actions?: ReactNode; children?: ReactNode }) {
  const heading = useRef<HTMLHeadingElement>(null);
  useEffect(() => {
    document.title = `${title} · Symphony`;
  }, [title]);
  useEffect(() => {
    pendingHeading = heading.current;
    if (headingWanted && heading.current) {
      headingWanted = false;
      heading.current.focus();
    }
    return () => {
      if (pendingHeading === heading.current) pendingHeading = null;
    };
  }, []);
  return (
    <div className="page-header">
      <div>
        <h1 ref={heading} tabIndex={-1} className="page-title">
          {title}
        </h1>
        {children && <p className="lede">{children}</p>}
      </div>
      {actions && <div className="page-actions">{actions}</div>}
    </div>
  );
}
