"""The `art` command line. Each subcommand imports what it needs only when it runs.

    art serve --host 127.0.0.1 --port 8000 --path ./.art --api-key KEY
    art run --host 127.0.0.1 --port 7999 --path ./.art
    art autorl "Answer questions about our return policy" --steps 10 --path ./.art
    art show ./.art --project my-task
    art migrate ./.art/my-task/models/agent --dry-run
    art runtime status
    art runtime prepare --dry-run

Add a subcommand by writing an `_add_<name>(subparsers)` that sets `handler` and
listing it in `_COMMANDS`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import socket
    from types import FrameType

_LOOPBACK_NAMES = ("localhost",)


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _add_serve(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve and train models over HTTP (the server of ServerlessBackend)",
        description="Serve and train models over an authenticated HTTP API: the training "
        "API ServerlessBackend speaks, and an OpenAI-compatible /v1 endpoint. It runs in "
        "the foreground, logging each model registered or deleted, each training job's "
        "start and end, and each rejected request to stderr. Stop it with Ctrl-C (SIGINT) "
        "or SIGTERM: it finishes the requests in flight, then shuts its engines down; a training "
        "job cut off by the stop is reported as failed after a restart, and its model "
        "resumes from its latest checkpoint.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    parser.add_argument("--path", default="./.art", help="where models are stored (./.art)")
    parser.add_argument(
        "--api-key",
        default=None,
        help="the admin key, sent as 'Authorization: Bearer <key>'; it can issue keys scoped "
        "to projects or models (POST /v1/keys) (default: $ART_API_KEY)",
    )
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="serve without a key; only allowed on a loopback address",
    )
    parser.add_argument(
        "--max-body-mb",
        type=float,
        default=64.0,
        help="largest request body accepted, in MiB (default 64)",
    )
    parser.add_argument(
        "--upload-quota-mb",
        type=float,
        default=1024.0,
        help="SFT upload MiB not yet trained that each scoped key may hold; 0: no limit "
        "(default 1024)",
    )
    parser.add_argument(
        "--ray",
        action="store_true",
        help="run the engines and trainers on a Ray cluster (replicas and a trainer group)",
    )
    parser.add_argument(
        "--ray-config",
        default=None,
        help="with --ray: RayConfig fields as JSON, e.g. "
        '\'{"address": "auto", "replicas": 4, "trainer_workers": 2}\'',
    )
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    api_key = args.api_key or os.environ.get("ART_API_KEY") or None
    if args.no_auth and api_key:
        return _fail("--no-auth and an API key were both given; drop one")
    if args.no_auth and not _is_loopback(args.host):
        return _fail(
            f"--no-auth is only allowed on a loopback address, not --host {args.host}; "
            "set --api-key (or ART_API_KEY) to serve on the network"
        )
    if not args.no_auth and not api_key:
        return _fail(
            "no API key: pass --api-key or set ART_API_KEY "
            "(or, on 127.0.0.1 only, --no-auth to serve without one)"
        )
    if args.max_body_mb <= 0:
        return _fail("--max-body-mb must be positive")
    if args.upload_quota_mb < 0:
        return _fail("--upload-quota-mb must be 0 (no limit) or positive")
    if args.ray_config is not None and not args.ray:
        return _fail("--ray-config is only read with --ray; add --ray")
    placement = None
    if args.ray:
        from .backends.ray.config import RayConfig
        from .backends.ray.placement import RayPlacement
        from .core.data.errors import ConfigError

        try:
            fields = json.loads(args.ray_config or "{}")
            if not isinstance(fields, dict):
                return _fail("--ray-config must be a JSON object of RayConfig fields")
            placement = RayPlacement(RayConfig(**fields))
        except json.JSONDecodeError as error:
            return _fail(f"--ray-config is not JSON: {error}")
        except ConfigError as error:
            return _fail(f"--ray-config: {error}")

    from .serve import build_server_app

    app = build_server_app(
        args.path,
        None if args.no_auth else api_key,
        max_body_bytes=int(args.max_body_mb * 2**20),
        upload_quota_bytes=int(args.upload_quota_mb * 2**20) or None,
        placement=placement,
    )
    print(f"art serve: models under {os.path.abspath(args.path)}", file=sys.stderr, flush=True)
    # From art.serve: one info line per model registered or deleted and per training job
    # started or ended, one warning line per rejected request, instead of an access log
    # line for every request. Other libraries' loggers stay at warning.
    logging.basicConfig(format="%(levelname)s:     %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("art.serve").setLevel(logging.INFO)
    try:
        _serve_http(app, args.host, args.port)
    finally:
        app.state.art_server.close()
    return 0


# Set by the first SIGINT this process gets. Python runs a signal handler between any two
# bytecodes, also inside a weakref callback or __del__ (an import's module-lock callback,
# say), where the KeyboardInterrupt it raises is printed and dropped: the command would
# then start its server and run on (seen in tests/test_sigint.py, SIGINT 1.9 s into `art
# run`). The flag outlives a dropped exception; `_serve_http` reads it once uvicorn's own
# signal handlers are in place.
_interrupted = threading.Event()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _interrupted.set()
    raise KeyboardInterrupt


def _serve_http(app: Any, host: str, port: int) -> None:
    """Serve `app` with uvicorn until SIGINT or SIGTERM, a SIGINT before it started included."""
    import uvicorn

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if _interrupted.is_set():  # a SIGINT came before uvicorn's handlers did
                self.should_exit = True

    config = uvicorn.Config(
        app, host=host, port=port, log_level="info", lifespan="off", access_log=False
    )
    server = _Server(config)
    with contextlib.suppress(KeyboardInterrupt):  # the signal uvicorn re-raises at its end
        server.run()
    if not server.started and not _interrupted.is_set():
        sys.exit(3)  # as uvicorn.run: the server never started (the port was taken, say)


def _add_run(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="serve ART 0.5.x's remote backend protocol (for clients that integrate with ART)",
        description="Serve ART 0.5.x's backend protocol over HTTP (/register, /_get_step, "
        "/_prepare_backend_for_training, /_train_model, /_delete_checkpoint_files, /close, "
        "/healthcheck) and the OpenAI-compatible /v1 endpoint the model is sampled from, on "
        "one model service that stores models under --path. ART's own `art run` has no key "
        "and binds 0.0.0.0: this one binds 127.0.0.1 unless told otherwise; without "
        "--api-key it belongs on 127.0.0.1 or a private network. Stop it with Ctrl-C.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=7999, help="port to bind (default 7999)")
    parser.add_argument("--path", default="./.art", help="where models are stored (./.art)")
    parser.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer <key>' on every route but /healthcheck "
        "(default: none, as ART's)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        return _fail(f"--port {args.port} is not a port number (1-65535)")
    if args.api_key is not None and not args.api_key.strip():
        return _fail("--api-key is empty; give a key or leave the option out")
    if args.api_key is None and not _is_loopback(args.host):
        print(
            f"art run: warning: no --api-key on --host {args.host}: anyone who reaches this "
            "address can train, delete and sample models; keep it on a private network",
            file=sys.stderr,
        )
    from .serve.art_run import build_run_app

    app = build_run_app(args.path, args.api_key, host=args.host)
    print(f"art run: models under {os.path.abspath(args.path)}", file=sys.stderr, flush=True)
    logging.basicConfig(format="%(levelname)s:     %(name)s: %(message)s", stream=sys.stderr)
    try:
        _serve_http(app, args.host, args.port)
    finally:
        app.state.listeners.close()
        asyncio.run(app.state.backend.close())
    return 0


def _add_autorl(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "autorl",
        help="train a model from a one-sentence task description (no data, no labels)",
        description="Write training inputs for a task with a generator model, train the "
        "base model on them with RULER rewards, and report how far it moved past the base.",
    )
    parser.add_argument("task", help="what the model should do, in a sentence")
    parser.add_argument(
        "--base-model",
        default="HuggingFaceTB/SmolLM2-135M-Instruct",
        help="the model to train (default: the embedded SmolLM2-135M-Instruct)",
    )
    parser.add_argument(
        "--judge", default=None, help="a LiteLLM model for RULER (default: the base model)"
    )
    parser.add_argument(
        "--generator", default=None, help="a LiteLLM model for the inputs (default: the base model)"
    )
    parser.add_argument("--steps", type=int, default=10, help="train until this step (10)")
    parser.add_argument("--path", default="./.art", help="where the run is stored (./.art)")
    parser.add_argument("--project", default="autorl", help="project name (autorl)")
    parser.add_argument("--name", default="autorl", help="model name (autorl)")
    parser.add_argument("--num-inputs", type=int, default=16, help="training inputs (16)")
    parser.add_argument("--num-val", type=int, default=4, help="validation inputs (4)")
    parser.add_argument("--groups-per-step", type=int, default=2, help="inputs per step (2)")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per input (4)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (64)")
    parser.add_argument("--eval-every", type=int, default=1, help="validate every N steps (1)")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="(1e-4)")
    parser.add_argument("--system-prompt", default=None, help="the agent's (default: written)")
    parser.set_defaults(handler=_autorl)


def _autorl(args: argparse.Namespace) -> int:
    import asyncio

    from .core.data.errors import ArtError

    try:
        return asyncio.run(_run_autorl(args))
    except ArtError as error:
        return _fail(str(error))


async def _run_autorl(args: argparse.Namespace) -> int:
    from .autorl import train
    from .autorl.report import summary_table, write_html, write_plot
    from .local import LocalBackend

    backend = LocalBackend(path=args.path)
    try:
        result = await train(
            args.task,
            args.base_model,
            args.judge,
            args.steps,
            backend=backend,
            path=args.path,
            project=args.project,
            name=args.name,
            generator_model=args.generator,
            system_prompt=args.system_prompt,
            num_inputs=args.num_inputs,
            num_val=args.num_val,
            groups_per_step=args.groups_per_step,
            group_size=args.group_size,
            max_tokens=args.max_tokens,
            eval_every=args.eval_every,
            learning_rate=args.learning_rate,
        )
    finally:
        await backend.close()
    if result.evaluations:
        write_plot(result.evaluations, result.run_dir / "validation.png")
    report = write_html(result, result.run_dir / "report.html")
    print(f"\nAutoRL: step {result.start_step} -> {result.step}")
    print(summary_table(result))
    if result.groups_judged:
        print(
            f"{result.groups_with_spread} of {result.groups_judged} judged groups had scores "
            "that differ; a GRPO step learns only from those."
        )
        if not result.groups_with_spread:
            print(
                "The judge gave every rollout of a group the same score, so nothing was learned. "
                "A stronger judge tells them apart: --judge openai/gpt-4.1-mini with "
                "OPENAI_API_KEY set, or any LiteLLM model."
            )
    for evaluation in result.evaluations[-1:]:
        if unjudged := len(evaluation.samples) - evaluation.judged:
            print(
                f"The judge could not score {unjudged} of {len(evaluation.samples)} validation "
                f"inputs at step {evaluation.step}; why is in evaluations.json and the report."
            )
    print(f"run: {result.run_dir}\nreport: {report}")
    return 0


def _add_show(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "show",
        help="write and open an offline HTML page of a project's runs",
        description="Write one static HTML page (no network needed) with every metric of "
        "each model's history.jsonl per step, and a browser of the logged trajectories, "
        "then open it in a web browser.",
    )
    parser.add_argument(
        "path",
        nargs="?",
        default="./.art",
        help="where the runs are stored (./.art), or a project's or model's directory",
    )
    parser.add_argument(
        "--project", default=None, help="the project to show (needed when PATH holds several)"
    )
    parser.add_argument(
        "--out", default=None, help="where to write the page (default <PATH>/<project>/viewer.html)"
    )
    parser.add_argument("--no-open", action="store_true", help="write the page, do not open it")
    parser.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
    from .core.data.errors import ArtError
    from .viewer import write_page

    try:
        page = write_page(args.path, project=args.project, out=args.out).resolve()
    except ArtError as error:
        return _fail(str(error))
    print(f"art show: wrote {page}")
    if not args.no_open:
        import webbrowser

        if not webbrowser.open(page.as_uri()):
            print("art show: no web browser could be started; open the file above yourself")
    return 0


def _add_migrate(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "migrate",
        help="convert older JSONL trajectory logs to Parquet (ART's `art migrate`)",
        description="Rewrite each trajectories/{split}/{step}.jsonl log that older ART "
        "(0.4.x, early 0.5.x) wrote as the .parquet file `art show`, LocalBackend and "
        "art.utils.trajectory_logging read, then delete the JSONL file unless --keep-jsonl. "
        "A file that fails, or whose .parquet twin already exists, is left as it was and "
        "named; the command then exits with status 1.",
    )
    parser.add_argument(
        "path",
        help="a model's directory, a project's directory, or a trajectories directory "
        "(or one split's)",
    )
    parser.add_argument(
        "--dry-run", "-n", action="store_true", help="say what would be migrated, change nothing"
    )
    parser.add_argument(
        "--keep-jsonl", action="store_true", help="keep the JSONL files after conversion"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="print each file")
    parser.set_defaults(handler=_migrate)


def _migrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .core.store.trajectory_migration import (
        MigrationResult,
        migrate_model_dir,
        migrate_trajectories_dir,
    )

    path = Path(args.path)
    if not path.exists():
        return _fail(f"path does not exist: {path}")

    def progress(indent: str) -> Callable[[str], None] | None:
        return (lambda line: print(f"{indent}{line}")) if args.verbose else None

    options = {"delete_originals": not args.keep_jsonl, "dry_run": args.dry_run}
    if (path / "trajectories").is_dir():
        print(f"Migrating model directory: {path}")
        result = migrate_model_dir(path, progress_callback=progress("  "), **options)
    elif (
        path.name == "trajectories"
        or any(path.glob("[0-9]*.jsonl"))
        or any(path.glob("*/[0-9]*.jsonl"))
    ):  # a trajectories directory, or one split's (ART takes the former only)
        print(f"Migrating trajectories directory: {path}")
        result = migrate_trajectories_dir(path, progress_callback=progress("  "), **options)
    elif (path / "models").is_dir():
        print(f"Migrating project directory: {path}")
        result = MigrationResult()
        for model_dir in sorted((path / "models").iterdir()):
            if model_dir.is_dir():
                if args.verbose:
                    print(f"Processing model: {model_dir.name}")
                result += migrate_model_dir(
                    model_dir, progress_callback=progress("    "), **options
                )
    else:
        return _fail(
            f"{path} is not a model, project or trajectories directory (a model's holds "
            "trajectories/, a project's models/)"
        )
    megabytes = result.space_saved / 1024 / 1024
    if args.dry_run:
        print(f"\n[DRY RUN] Would migrate {result.files_migrated} files")
        if result.bytes_before:
            print(f"  Estimated space savings: {megabytes:.1f} MB")
    else:
        print(f"\nMigrated {result.files_migrated} files")
        if result.files_skipped:
            print(f"Skipped {result.files_skipped} files")
        if result.bytes_before and result.bytes_after:
            print(f"Space saved: {megabytes:.1f} MB ({result.compression_ratio:.1f}x compression)")
    if result.errors:
        print(f"\nErrors ({len(result.errors)}):", file=sys.stderr)
        for error in result.errors:
            print(f"  {error}", file=sys.stderr)
        return 1
    return 0


_MEGATRON_FLAGS = ("hybrid_ep", "multinode")


def _add_runtime(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "runtime",
        help="inspect and prepare the engine and trainer environments (ART's `art runtime`)",
        description="The Python environments a LocalBackend runs its parts in: this one "
        "(transformers engine, PEFT trainer), vLLM's (.venv-vllm or ART_VLLM_PYTHON) and "
        "Unsloth's (.venv-unsloth or ART_UNSLOTH_PYTHON).",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    status = actions.add_parser(
        "status", help="which environments are ready here, and whether CUDA is"
    )
    status.add_argument(
        "--size",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure each environment's disk use (default: on)",
    )
    prepare = actions.add_parser(
        "prepare", help="build the environments that are missing (make venv-vllm, venv-unsloth)"
    )
    prepare.add_argument(
        "--dry-run", "-n", action="store_true", help="say what would be built, build nothing"
    )
    for action in (status, prepare):
        for flag in _MEGATRON_FLAGS:
            action.add_argument(
                f"--{flag.replace('_', '-')}",
                action="store_true",
                help="ART's Megatron runtime variant; refused here (no Megatron trainer)",
            )
    status.set_defaults(handler=_runtime_status)
    prepare.set_defaults(handler=_runtime_prepare)


def _refuse_megatron_flags(args: argparse.Namespace) -> int | None:
    given = [f"--{flag.replace('_', '-')}" for flag in _MEGATRON_FLAGS if getattr(args, flag)]
    if not given:
        return None
    return _fail(
        f"{', '.join(given)}: ART's Megatron runtime variants, which this version does not "
        "build (see art.megatron); run the command without them"
    )


def _runtime_status(args: argparse.Namespace) -> int:
    from .runtime.environments import cuda_summary, inspect_environments

    refused = _refuse_megatron_flags(args)
    if refused is not None:
        return refused
    print(f"cuda: {cuda_summary()}")
    for status in inspect_environments(include_size=args.size):
        version = f", {status.version}" if status.version else ""
        state = "ready" if status.ready else "not prepared"
        print(f"{status.name}: {state} ({status.mode}{version}; {status.uses})")
        if status.python is not None:
            print(f"  runtime: {status.python}")
        if status.disk_bytes is not None:
            print(f"  storage: {status.disk_bytes / 2**30:.2f} GiB")
        if status.warning:
            print(f"  warning: {status.warning}", file=sys.stderr)
    return 0


def _runtime_prepare(args: argparse.Namespace) -> int:
    import time

    from .runtime.environments import (
        PrepareError,
        inspect_environments,
        preparation_commands,
        prepare_environments,
    )

    refused = _refuse_megatron_flags(args)
    if refused is not None:
        return refused
    started = time.perf_counter()
    try:
        if args.dry_run:
            commands = preparation_commands(inspect_environments())
            for name, command in commands:
                print(f"{name}: would run {' '.join(command)}")
            if not commands:
                print("All runtimes are ready; nothing to build.")
            return 0
        prepared = prepare_environments(progress=lambda message: print(f"art runtime: {message}"))
    except PrepareError as error:
        print(f"Runtime preparation failed: {error}", file=sys.stderr)
        return 1
    for status, seconds in prepared:
        print(f"{status.name}: ready ({status.mode}) in {seconds:.1f}s at {status.python}")
    print(f"All requested runtimes are ready in {time.perf_counter() - started:.1f}s.")
    return 0


def runtime_status(hybrid_ep: bool = False, multinode: bool = False, size: bool = True) -> None:
    """ART's `art runtime status` from Python: prints each environment's state."""
    argv = ["runtime", "status", "--size" if size else "--no-size"]
    argv += ["--hybrid-ep"] * hybrid_ep + ["--multinode"] * multinode
    _exit_on_failure(main(argv))


def runtime_prepare(hybrid_ep: bool = False, multinode: bool = False) -> None:
    """ART's `art runtime prepare` from Python: builds the environments that are missing."""
    argv = ["runtime", "prepare"] + ["--hybrid-ep"] * hybrid_ep + ["--multinode"] * multinode
    _exit_on_failure(main(argv))


def _exit_on_failure(code: int) -> None:
    if code != 0:
        raise SystemExit(code)


def _fail(message: str) -> int:
    print(f"art: error: {message}", file=sys.stderr)
    return 2


_COMMANDS: list[Callable[[Any], None]] = [
    _add_serve,
    _add_run,
    _add_autorl,
    _add_show,
    _add_migrate,
    _add_runtime,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="art", description="Train LLM agents with GRPO.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `art` console script and `python -m art`."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)
    args = build_parser().parse_args(argv)
    # LiteLLM fetches its model price list from GitHub at import unless told otherwise; the
    # copy it ships is enough for cost metrics and keeps the command quiet and fast offline.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())


def __getattr__(name: str) -> Any:
    from ._refusals import refused_name

    return refused_name(__name__, name)
