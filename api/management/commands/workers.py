"""Operator procedures on a running stack's workers (docs/DEPLOY.md, "Scale-out"):

manage.py workers list
manage.py workers drain NAME [--wait SECONDS]
manage.py workers undrain NAME
manage.py workers remove NAME
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError, CommandParser

from api.services import executor_presence, routing, worker_fleet


class Command(BaseCommand):
    help = "List, drain, undrain or remove gpu_workers of this stack."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "drain", "undrain", "remove"])
        parser.add_argument("name", nargs="?", help="the worker (SYMPHONY_WORKER_NAME)")
        parser.add_argument("--wait", type=float, default=0, help="drain: seconds to wait for its runs to end")

    def handle(self, *args: object, **options: object) -> None:
        action, name = str(options["action"]), options.get("name")
        if action == "list":
            self._list()
            return
        if not name:
            raise CommandError(f"workers {action} needs the worker's name")
        name = str(name)
        if action == "drain":
            state = worker_fleet.drain(name)
            deadline = time.monotonic() + float(options["wait"] or 0)  # type: ignore[arg-type]
            while not state.idle and time.monotonic() < deadline:
                time.sleep(1)
                state = worker_fleet.drain_state(name)
            self._show(state)
            if options["wait"] and not state.idle:
                raise CommandError(f"worker {name!r} still has runs after {options['wait']}s")
        elif action == "undrain":
            self._show(worker_fleet.undrain(name))
        else:
            try:
                removed = worker_fleet.remove(name)
            except worker_fleet.FleetError as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"removed {removed.worker}: {removed.kv_rows} KV rows")

    def _show(self, state: worker_fleet.DrainState) -> None:
        self.stdout.write(
            f"{state.worker}: draining={state.draining} running={state.running} queued={state.queued} "
            f"heartbeat={state.heartbeat} executor={state.executor} idle={state.idle}"
        )

    def _list(self) -> None:
        slots = executor_presence.executor_slots_by_worker()
        drained = worker_fleet.draining()
        for w in sorted(routing.live_workers(), key=lambda w: w.name):
            self.stdout.write(
                f"{w.name}: ok={w.ok} pages_free={w.pages_free}/{w.pages_total} sessions={w.sessions} "
                f"executor_slots={slots.get(w.name, 0)} draining={w.name in drained}"
            )
