"""The commands of ``marsys-mem`` (or ``python -m marsys_mem``).

The console script is :func:`marsys_mem.cli.main.main`, which answers ``--version``
without importing this module (or anything heavier than the package's version).

Commands::

    marsys-mem --version                  the installed version
    marsys-mem demo                       run the bundled research-team workflow, print its report
    marsys-mem demo --windows             one conversation, three context strategies, one budget
    marsys-mem run WORKFLOW [--json] [--store DIR] [--mqtt HOST:PORT] [--strict] [--append]
                   [--allow-env NAME] [--allow-base-url URL]
    marsys-mem validate FILE [--strict] [--allow-env NAME] [--allow-base-url URL]
    marsys-mem schema [--workflow]        JSON Schema of the config (or workflow) format
    marsys-mem inspect STORE [--json]     what a SQLite store holds (read-only, any schema)
    marsys-mem migrate STORE [--no-backup]  upgrade a SQLite store's schema, whole or not at all
    marsys-mem migrate --postgres [--dsn-env NAME]  the same for PostgreSQL ($MARSYS_MEM_PG_DSN)
    marsys-mem search STORE QUERY [--agent A] [--branch B] [-k K] [--mode auto|bm25|hybrid]
                                  [--min-score S]
    marsys-mem mcp [--config POLICY] [--transport stdio|http] [--host H] [--port N]
                   [--tokens FILE] [--allow-host H] [--allow-origin O] [--insecure]

Exit codes: 0 ok; 1 a runtime failure, or a question whose ``expect`` was not found;
2 bad input (a bad file, flag or argument; with ``validate --strict`` also a warning).
Output is coloured on a terminal and plain otherwise; progress goes to stderr, on a
terminal only. A file is not trusted with secrets: ``--allow-env`` / ``--allow-base-url``
(or ``MARSYS_MEM_ALLOW_ENV`` / ``MARSYS_MEM_ALLOW_BASE_URL``) allow a file's ``llm:`` another
key variable than the provider's, or a key sent to another server
(:mod:`marsys_mem.workflow.trust`).

This module holds the parser, the commands and the error reporting; the package's other
modules hold what the commands use: :mod:`~marsys_mem.cli.output` (printing),
:mod:`~marsys_mem.cli.demo` (the demo) and :mod:`~marsys_mem.cli.inspect` (looking
inside a store).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from marsys_mem import __version__
from marsys_mem.cli.demo import windows_demo, workflow_demo
from marsys_mem.cli.inspect import InvalidRow, find_store, inspect_store, search_store
from marsys_mem.cli.output import Output, progress_bar, safe_text, status_spinner
from marsys_mem.config.lifetimes import lifetimes
from marsys_mem.config.load import config_schema
from marsys_mem.config.models import PG_DSN_ENV
from marsys_mem.exceptions import ConfigError, MarsysMemError, StoreError, StoreNotFoundError
from marsys_mem.manager import MemoryManager
from marsys_mem.retrieval.calibration import DEFAULT_MIN_SCORE
from marsys_mem.store.sqlite import SCHEMA_VERSION, migrate_file
from marsys_mem.workflow import (
    FileTrust,
    Workflow,
    check_file,
    load_workflow,
    prepare_workflow,
    run_workflow,
)
from marsys_mem.workflow.models import workflow_schema
from marsys_mem.workflow.trust import llm_route

__all__ = ["run_command"]


# ---------------------------------------------------------------------------- commands
class _WarningLines(logging.Handler):
    """The workflow's warnings as ``warning: ...`` lines on stderr, escaped."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"warning: {safe_text(record.getMessage())}", file=sys.stderr)


def _trust(args: argparse.Namespace) -> FileTrust:
    """The user-level setting, plus this command's ``--allow-env`` / ``--allow-base-url``."""
    return FileTrust.from_env().allowing(args.allow_env or (), args.allow_base_url or ())


def _run_and_print(
    out: Output,
    workflow: Path,
    *,
    store: str | None,
    mqtt: str | None,
    as_json: bool,
    progress: bool,
    trust: FileTrust | None = None,
    strict: bool = False,
    append: bool = False,
) -> int:
    wf = load_workflow(workflow)  # validate before anything is written
    logger = logging.getLogger("marsys_mem.workflow")
    handler = _WarningLines(logging.WARNING)
    logger.addHandler(handler)
    try:
        with progress_bar(f"running {wf.name}", progress and not as_json) as callback:
            report = run_workflow(
                wf,
                store_dir=store,
                mqtt=mqtt,
                progress=callback,
                trust=trust,
                strict=strict,
                append=append,
            )
    finally:
        logger.removeHandler(handler)
    if as_json:
        print(report.to_json(), file=out.stream)
    else:
        out.report(report.to_text())
    return 0 if report.ok else 1


def cmd_demo(out: Output, args: argparse.Namespace) -> int:
    if args.windows:
        windows_demo(out, args.max_tokens, args.turns)
        return 0
    return workflow_demo(out, store=args.store, mqtt=args.mqtt, as_json=args.json)


def cmd_run(out: Output, args: argparse.Namespace) -> int:
    return _run_and_print(
        out,
        Path(args.workflow),
        store=args.store,
        mqtt=args.mqtt,
        as_json=args.json,
        progress=not args.quiet,
        trust=_trust(args),
        strict=args.strict,
        append=args.append,
    )


def cmd_validate(out: Output, args: argparse.Namespace) -> int:
    result = check_file(args.file, trust=_trust(args))
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.strict and result.warnings:
        count = len(result.warnings)
        print(f"error: {count} warning{'s' if count > 1 else ''} (--strict)", file=sys.stderr)
        return 2
    value = result.value
    if isinstance(value, Workflow):
        prepared = prepare_workflow(value)
        model = f", model {llm_route(prepared.llm)}" if prepared.llm else ""
        out.print(
            f"ok: workflow {value.name!r}: {len(value.agents)} agents, "
            f"{len(prepared.initial)} initial branch(es), {prepared.count} steps to run{model}",
            "green",
        )
    else:
        agents = ", ".join(value.agents) or "none"
        out.print(
            f"ok: retention config: store {value.store.backend}, default retention "
            f"{value.defaults.retention}, agents: {agents}",
            "green",
        )
        for agent in [*value.agents, "(any other agent)"]:
            policy = value.policy_for(agent) if agent in value.agents else value.defaults
            out.print(f"  {agent} ({policy.retention}):")
            for kind, lifetime in lifetimes(policy):
                out.print(f"    {kind}: {lifetime}")
        out.print(
            "  shared facts: until forgotten (forget_shared, MCP forget), in every process"
        )
    return 0


def cmd_schema(out: Output, args: argparse.Namespace) -> int:
    schema = workflow_schema() if args.workflow else config_schema()
    document = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    print(json.dumps(document, indent=2), file=out.stream)
    return 0


def cmd_inspect(out: Output, args: argparse.Namespace) -> int:
    summary = inspect_store(args.store)
    if args.json:
        print(summary.model_dump_json(indent=2), file=out.stream)
        return 0
    out.print(f"== store {summary.path}", "bold cyan")
    out.print(
        f"   integrity {summary.integrity}; namespaces: {', '.join(summary.namespaces) or '-'}; "
        f"{len(summary.agents)} agents, {len(summary.branches)} branches, "
        f"{summary.messages} messages, {len(summary.facts)} shared facts, {summary.runs} runs"
    )
    if summary.schema_version < SCHEMA_VERSION:
        out.print(
            f"   schema version {summary.schema_version}, older than {SCHEMA_VERSION}: read as "
            f"it is; `marsys-mem migrate {summary.path}` upgrades it",
            "yellow",
        )
    _print_invalid(out, summary.invalid)
    if summary.conversations:
        out.print("\n== Conversations", "bold cyan")
        out.table(
            ["namespace", "agent@branch", "messages", "runs", "last message"],
            [
                [
                    c.namespace,
                    c.key,
                    c.messages,
                    c.runs,
                    (c.last_message.strftime("%Y-%m-%d %H:%M:%S") if c.last_message else "-")
                    + (f"  {c.last_text[:50]}" if c.last_text else ""),
                ]
                for c in summary.conversations
            ],
        )
    if summary.internal:
        out.print("\n== Memory patterns and records", "bold cyan")
        out.table(
            ["namespace", "key", "kind", "entries"],
            [[i.namespace, f"{i.agent}/{i.branch}", i.kind, i.messages] for i in summary.internal],
        )
    if summary.facts:
        out.print(f"\n== Shared facts ({len(summary.facts)})", "bold cyan")
        for f in summary.facts:
            how = f"merged from {f.merged_from}" if f.merged_from else f.scope
            topic = f", topic {f.topic}" if f.topic else ""
            out.print(
                f"   [{f.branch}] {f.source_agent}@{f.source_branch} ({how}{topic}): {f.text}"
            )
            if f.lost_to:
                out.print(f"      lost {f.lost_to}", "yellow")
    if not summary.conversations and not summary.internal:
        out.print("\n(the store is empty)")
    return 0


def _print_invalid(out: Output, invalid: list[InvalidRow]) -> None:
    """``N invalid rows skipped (key K, id X: reason; ...)``, the first few in full."""
    if not invalid:
        return
    shown = "; ".join(row.described for row in invalid[:5])
    more = f"; and {len(invalid) - 5} more" if len(invalid) > 5 else ""
    rows = "row" if len(invalid) == 1 else "rows"
    out.print(f"   {len(invalid)} invalid {rows} skipped ({shown}{more})", "yellow")


def cmd_search(out: Output, args: argparse.Namespace) -> int:
    invalid: list[InvalidRow] = []
    with status_spinner("searching") as status:
        hits, how = search_store(
            args.store,
            args.query,
            agent=args.agent,
            branch=args.branch,
            k=args.k,
            mode=args.mode,
            status=status,
            on_invalid=invalid.append,
            min_score=args.min_score,
        )
    if args.json:
        data = {
            "query": args.query,
            "how": how,
            "hits": [h.model_dump(mode="json") for h in hits],
            "invalid": [row.model_dump(mode="json") for row in invalid],
        }
        print(json.dumps(data, indent=2, ensure_ascii=False), file=out.stream)
        return 0
    out.print(f"== {len(hits)} hit(s) for {args.query!r} ({how})", "bold cyan")
    _print_invalid(out, invalid)
    if hits:
        out.table(
            ["#", "score", "agent@branch", "role", "text"],
            [
                [
                    h.rank,
                    f"{h.score:.3f}",
                    h.where,
                    "fact, lost" if h.lost_to else h.role,
                    h.text[:90],
                ]
                for h in hits
            ],
        )
    for h in hits:  # a fact that lost a conflict is not a plain hit: say to what
        if h.lost_to:
            out.print(f"   #{h.rank} lost {h.lost_to[:160]}", "yellow")
    return 0


def _migrate_postgres(out: Output, dsn_env: str) -> int:
    dsn = os.environ.get(dsn_env)
    if not dsn:
        raise ValueError(f"--postgres: ${dsn_env} is not set (the DSN of the database)")
    # the postgres extra is optional: a missing psycopg is an ImportError naming the extra
    from marsys_mem.store import postgres  # noqa: PLC0415 (optional dependency: postgres)

    # opening migrates, in one transaction (all or nothing) under an advisory lock
    with postgres.PostgresStore(dsn, min_size=0, max_size=1) as store:
        found, where = store.found_schema_version, store.where
    latest = len(postgres.MIGRATIONS)
    if found == latest:
        out.print(f"{where}: schema version {latest}, up to date (unchanged)")
    else:
        out.print(f"{where}: migrated from schema version {found} to {latest}", "green")
    return 0


def cmd_migrate(out: Output, args: argparse.Namespace) -> int:
    if args.postgres:
        if args.store is not None:
            raise ValueError("migrate: give a STORE file or --postgres, not both")
        return _migrate_postgres(out, args.dsn_env)
    if args.store is None:
        raise ValueError("migrate needs a STORE (a SQLite file or folder), or --postgres")
    done = migrate_file(find_store(args.store), backup=not args.no_backup)
    if not done.changed:
        out.print(f"{done.path}: schema version {done.to_version}, up to date (unchanged)")
        return 0
    kept = f"; the original is kept as {done.backup}" if done.backup else ""
    out.print(
        f"{done.path}: migrated from schema version {done.from_version} to "
        f"{done.to_version}{kept}",
        "green",
    )
    return 0


def cmd_mcp(out: Output, args: argparse.Namespace) -> int:
    # the mcp extra is optional: a missing SDK is a MissingDependencyError naming the extra
    from marsys_mem.integrations.mcp import serve  # noqa: PLC0415 (optional dependency: mcp)

    serve(
        args.config,
        args.transport,
        host=args.host,
        port=args.port,
        name=args.name,
        tokens=args.tokens,
        allowed_hosts=tuple(args.allow_host or ()),
        allowed_origins=tuple(args.allow_origin or ()),
        insecure=args.insecure,
    )
    return 0


def cmd_forget(out: Output, args: argparse.Namespace) -> int:
    if not (args.message_id or args.everything or args.fact_id or args.sharer or args.all_facts):
        raise ValueError(
            "forget needs what to forget: --message-id ID, --everything (with --agent), "
            "--fact-id ID, --sharer AGENT or --all-facts"
        )
    if (args.message_id or args.everything) and not args.agent:
        raise ValueError("--message-id and --everything need --agent")
    with MemoryManager.from_config(args.config) as manager:
        removed = 0
        if args.message_id or args.everything:
            removed = len(
                manager.forget(
                    args.agent,
                    args.branch,
                    message_ids=args.message_id or None,
                    everything=args.everything,
                )
            )
        facts = 0
        if args.fact_id:
            facts += len(manager.forget_shared(args.fact_id))
        if args.sharer:
            facts += len(manager.forget_shared(sharer=args.sharer))
        if args.all_facts:
            facts += len(manager.forget_shared(everything=True))
    out.print(f"forgot {removed} message(s) and {facts} shared fact(s)", "green")
    return 0


# ---------------------------------------------------------------------------- parser
class _Parser(argparse.ArgumentParser):
    """argparse with exit code 2 for every usage error (argparse's own convention)."""


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="marsys-mem",
        description="Memory for multi-agent LLM systems: run workflows, inspect stores.",
        epilog="Exit codes: 0 ok, 1 runtime failure or an unmet expectation, 2 bad input.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def mqtt_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--mqtt", metavar="HOST:PORT", help="share facts through this broker")

    def trust_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--allow-env",
            action="append",
            metavar="NAME",
            help="let the file's llm: read its key from NAME (repeatable; also "
            "MARSYS_MEM_ALLOW_ENV=NAME1,NAME2)",
        )
        p.add_argument(
            "--allow-base-url",
            action="append",
            metavar="URL",
            help="let the file's llm: send its key to URL's server (repeatable; also "
            "MARSYS_MEM_ALLOW_BASE_URL=URL1,URL2)",
        )

    p = sub.add_parser("demo", help="run the bundled research-team workflow")
    p.add_argument("--store", metavar="DIR", help="keep the store in DIR (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    mqtt_arg(p)
    p.add_argument(
        "--windows",
        action="store_true",
        help="instead: the context windows of one conversation, three strategies",
    )
    p.add_argument("--max-tokens", type=int, default=400, help="--windows: the budget")
    p.add_argument("--turns", type=int, default=40, help="--windows: conversation length")
    p.set_defaults(handler=cmd_demo)

    p = sub.add_parser("run", help="run a workflow file (YAML or JSON)")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--store", metavar="DIR", help="folder of the SQLite store (memory.db)")
    mqtt_arg(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--strict", action="store_true", help="warnings are errors (exit 2, nothing runs)"
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="a new run: append its messages to what earlier runs left in the store "
        "(default: a rerun on the same store appends nothing it already holds)",
    )
    trust_args(p)
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser(
        "validate", help="check a workflow or retention-policy file (every error at once)"
    )
    p.add_argument("file", metavar="CONFIG_OR_WORKFLOW")
    p.add_argument("--strict", action="store_true", help="warnings are errors (exit 2)")
    trust_args(p)
    p.set_defaults(handler=cmd_validate)

    p = sub.add_parser("schema", help="print the JSON Schema of the config format")
    p.add_argument("--workflow", action="store_true", help="the workflow format instead")
    p.set_defaults(handler=cmd_schema)

    p = sub.add_parser("inspect", help="show what a SQLite store holds")
    p.add_argument("store", metavar="STORE", help="a store file, or a folder holding memory.db")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_inspect)

    p = sub.add_parser(
        "migrate",
        help="upgrade a SQLite store to this version's schema (on a copy, swapped in whole)",
    )
    p.add_argument(
        "store", metavar="STORE", nargs="?", help="a store file, or a folder holding memory.db"
    )
    p.add_argument(
        "--no-backup", action="store_true", help="do not keep the original as STORE.vN.bak"
    )
    p.add_argument(
        "--postgres",
        action="store_true",
        help="instead: the PostgreSQL database whose DSN is in $MARSYS_MEM_PG_DSN",
    )
    p.add_argument(
        "--dsn-env",
        metavar="NAME",
        default=PG_DSN_ENV,
        help=f"--postgres: the variable holding the DSN (default {PG_DSN_ENV})",
    )
    p.set_defaults(handler=cmd_migrate)

    p = sub.add_parser("search", help="search the messages and recorded facts of a store")
    p.add_argument("store", metavar="STORE")
    p.add_argument("query", metavar="QUERY")
    p.add_argument("--agent")
    p.add_argument("--branch")
    p.add_argument("-k", type=int, default=5, help="number of hits (default 5)")
    p.add_argument(
        "--min-score",
        type=float,
        default=DEFAULT_MIN_SCORE,
        help="leave out hits whose calibrated score (0 to 1) is below it (default 0.8)",
    )
    p.add_argument(
        "--mode",
        choices=["auto", "bm25", "hybrid"],
        default="auto",
        help="hybrid: the agents' RAG memory (needs the embeddings extra)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_search)

    p = sub.add_parser(
        "forget",
        help="forget messages (and all derived from them) or shared facts, for good",
    )
    p.add_argument("--config", metavar="POLICY", required=True, help="retention-policy file")
    p.add_argument("--agent", help="whose messages (with --message-id or --everything)")
    p.add_argument("--branch", default="main")
    p.add_argument("--message-id", action="append", metavar="ID", help="repeatable")
    p.add_argument("--everything", action="store_true", help="all of the agent's messages")
    p.add_argument("--fact-id", action="append", metavar="ID", help="a shared fact; repeatable")
    p.add_argument("--sharer", metavar="AGENT", help="every fact this agent shared")
    p.add_argument("--all-facts", action="store_true", help="every shared fact")
    p.set_defaults(handler=cmd_forget)

    p = sub.add_parser("mcp", help="serve the agents' memory over MCP (needs the mcp extra)")
    p.add_argument(
        "--config", metavar="POLICY", help="retention-policy file (default: in memory, session)"
    )
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="http: the address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="http: the port (default 8000)")
    p.add_argument("--name", default="marsys-mem", help="the server's name shown to clients")
    p.add_argument(
        "--tokens",
        metavar="FILE",
        help="http: bearer tokens, each with the agents it may use (also MARSYS_MEM_MCP_TOKEN)",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        metavar="HOST",
        help="http: a Host header to accept besides loopback (your server's name); repeatable",
    )
    p.add_argument(
        "--allow-origin",
        action="append",
        metavar="ORIGIN",
        help="http: a browser Origin to accept (https://app.example.com); repeatable",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="http: serve off loopback WITHOUT authentication (anyone can read and forget)",
    )
    p.set_defaults(handler=cmd_mcp)
    return parser


def run_command(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run its command; returns the exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    out = Output(sys.stdout)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        code: int = args.handler(out, args)
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `marsys-mem schema | head`: the reader left
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:
        return _report_error(exc, debug=args.debug)


def _report_error(exc: Exception, *, debug: bool) -> int:
    bad_input = isinstance(exc, ConfigError | StoreNotFoundError) or (
        isinstance(exc, MarsysMemError) and isinstance(exc, ValueError)
    )
    if isinstance(exc, StoreError) and (
        "not a marsys-mem store" in str(exc) or "is not a marsys-mem database" in str(exc)
    ):
        bad_input = True
    if isinstance(exc, ValueError) and not isinstance(exc, MarsysMemError):
        bad_input = True  # bad arguments (an empty query, k < 1, ...)
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, MarsysMemError | ValueError | OSError):
        lines = str(exc).splitlines() or [""]
        for line in lines:  # a file's errors: one per line, each marked
            print(f"error: {safe_text(line)}", file=sys.stderr)
        if len(lines) > 1 and isinstance(exc, ConfigError) and not lines[-1].startswith("..."):
            print(f"{len(lines)} errors", file=sys.stderr)
    else:
        print(
            f"error: unexpected {type(exc).__name__}: {safe_text(str(exc))} (--debug shows "
            "where)",
            file=sys.stderr,
        )
    return 2 if bad_input else 1
