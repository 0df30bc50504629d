"""`sessionrl store ...`: check the store against its event log, and archive finished sessions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from sessionrl.cli.sessions import DEFAULT_DB, Db, err, open_store, out, reporting
from sessionrl.store.archive import Archive, archive_finished

app = typer.Typer(
    help="Store maintenance: consistency checks, the Parquet archive, a throwaway PostgreSQL to try.",
    no_args_is_help=True,
)

ArchiveUrl = Annotated[
    str, typer.Argument(help="Archive location: a folder, file://... or s3://bucket/prefix.")
]


@app.command("check")
def check(
    db: Db = DEFAULT_DB,
    repair: Annotated[
        bool, typer.Option("--repair", help="Rebuild drifted sessions from their log.")
    ] = False,
    archive: Annotated[
        str | None, typer.Option(help="Also compare with the digests of this archive (folder or URL).")
    ] = None,
) -> None:
    """Compare every session's event log with its materialised view, query rows and archived copy.

    Exits with status 1 when something disagrees and was not repaired (a broken log or a stale archive
    copy cannot be repaired from the store).
    """
    with reporting(), open_store(db, create=False) as store:
        report = store.consistency_check(repair=repair, archive=Archive(archive) if archive else None)
    if report.drift:
        table = Table("session", "where", "what", title=f"{len(report.drift)} disagreement(s)")
        for d in report.drift:
            table.add_row(escape(d.session_id), d.kind, escape(d.detail))
        out.print(table)
    unrepaired = {d.session_id for d in report.drift} - set(report.repaired)
    out.print(
        f"checked {report.sessions} session(s): {len(report.drift)} disagreement(s), "
        f"{len(report.repaired)} repaired"
    )
    if unrepaired:
        err.print(f"[red]{len(unrepaired)} session(s) still disagree with their log[/red]")
        raise typer.Exit(1)


@app.command("archive")
def archive(
    url: ArchiveUrl,
    db: Db = DEFAULT_DB,
    before: Annotated[
        datetime | None, typer.Option(help="Only sessions last updated before this time (UTC).")
    ] = None,
) -> None:
    """Write finished and rejected sessions to the Parquet archive and mark them archived."""
    cutoff = None if before is None else before if before.tzinfo else before.replace(tzinfo=UTC)
    with reporting(), open_store(db, create=False) as store:
        moved = archive_finished(store, Archive(url), before=cutoff)
    out.print(f"archived {moved} session(s) to {escape(url)}")


@app.command("postgres")
def postgres(
    durable: Annotated[
        bool, typer.Option("--durable", help="Wait for the disk on every commit (default: fast, losable).")
    ] = False,
) -> None:
    """Start a throwaway PostgreSQL server to try the PostgreSQL store on this machine; Ctrl-C stops it
    and deletes its data.

    It prints the store URL to pass as `--db` (a Unix socket in a temporary folder, no TCP port), then
    waits. As root, the server runs as the `postgres` user (PostgreSQL refuses root). Not for data that
    matters: unless `--durable`, it does not wait for the disk.
    """
    import signal
    import threading

    from sessionrl.store.postgres_server import LocalPostgres, find_bin_dir

    bin_dir = find_bin_dir()
    if bin_dir is None:
        err.print("error: PostgreSQL is not installed (no initdb on PATH or under /usr/lib/postgresql/*/bin)")
        raise typer.Exit(1)
    # Ctrl-C and SIGTERM only set `stop`: a signal never lands half-way through starting or stopping the
    # server, where it could leave PostgreSQL running (holding this process's output open) and its folder
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with reporting(), LocalPostgres(bin_dir, durable=durable) as server:
        open_store(server.url(), create=True).close()  # its tables exist before anyone connects
        out.print(server.url(), soft_wrap=True)
        err.print(f"PostgreSQL is up in {server.folder}; pass the URL above as --db. Ctrl-C stops it.")
        stop.wait()
    err.print("stopped; its data is gone")
