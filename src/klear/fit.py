"""``python -m klear.fit --config configs/rl.yaml [--objective NAME] [--resume] [key=value ...]``.

Parses and builds; the training logic lives in the stage's LightningModule. Everything that can be wrong with
the config, the output directory or the data is checked before the Trainer starts, and reported as one line. The
config and the output directory are checked before Lightning or transformers are imported, so a typo costs a
second; the data is checked (every row, before any step) once the model's tokenizer is loaded.
"""

from __future__ import annotations

import argparse
import sys

from omegaconf import DictConfig, OmegaConf

from klear import cli
from klear.config.load import load_config, read_yaml, save_config
from klear.errors import UserError, first_line
from klear.run.directory import RunDir, RunError, remove_path, write_failure
from klear.run.folder_lock import launching_process
from klear.run.loading_stop import (
    EXIT_INTERRUPTED,
    OutputState,
    Terminated,
    put_back,
    stop_outcome,
    stop_signals_raise,
)
from klear.run.preflight import preflight

# Keys that may change when a run is resumed; any other difference is refused. `output_dir` differs when a run
# directory was copied or moved, and the data paths when the data moved: `data_report.json` checks the content.
# `data.cache_dir` only says where tokenized sets are kept: what they hold is keyed by what they are made from.
# `reward.num_workers` and `reward.overlap` say where and when samples are scored, not what they score (a node with
# more cores may score in more workers).
RESUMABLE_CHANGES = {
    "trainer.max_steps",
    "trainer.epochs",
    "trainer.progress_bar",
    "trainer.cpu_threads",
    "trainer.keep_checkpoints",
    "trainer.keep_best",
    "trainer.best_metric",
    "logging.tensorboard",
    "logging.wandb",
    "logging.samples",
    "output_dir",
    "data.train",
    "data.eval",
    "data.cache_dir",
    "reward.num_workers",
    "reward.overlap",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog=cli.prog("fit"), description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML file listing deviations from the defaults")
    parser.add_argument("--objective", help="policy objective name or import path package.module:Class (RL)")
    parser.add_argument("--resume", action="store_true", help="continue the run in output_dir from its checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="replace a previous run in output_dir")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--list-objectives", action="store_true", help="list registered objectives and exit")
    parser.add_argument(
        "--help-config",
        nargs="?",
        const="",
        metavar="SECTION",
        help="list every key of the resolved config (or of SECTION, e.g. rollout) with its type, value, default "
        "and doc, and exit",
    )
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bar and no info lines: warnings, errors, the summary"
    )
    loudness.add_argument(
        "-v", "--verbose", action="store_true", help="klear's debug lines (per-step facts) and every library line"
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    args = parser.parse_intermixed_args(argv)
    if args.help_config and "=" in args.help_config:  # `--help-config key=value`: an override, not a SECTION
        args.overrides.insert(0, args.help_config)
        args.help_config = ""
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_loudness(args.quiet, args.verbose)
    if args.list_objectives:
        from klear.objectives import list_objectives, objective_defaults

        for name in list_objectives():
            print(f"{name}: {objective_defaults(name)}")
        return 0
    output = None  # what output_dir held before this start wrote to it
    try:
        with stop_signals_raise():  # until the fit: each rank stops at once (`klear.run.loading_stop`)
            config = load_config(args.config, args.overrides, args.objective)
            if args.help_config is not None:
                from klear.config.help import config_help, terminal_width

                print(config_help(config, args.help_config, terminal_width()))
                return 0
            if args.print_config:
                print(OmegaConf.to_yaml(config), end="")
                return 0
            if args.quiet:
                config.trainer.progress_bar = False
            check_output(RunDir(config.output_dir, resume=args.resume), config, args.resume, args.overwrite)
            preflight(config)  # the machine, model and data files: before output_dir holds anything
            output = OutputState(config.output_dir)
            run_dir, module, batches = start(config, resume=args.resume, overwrite=args.overwrite)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (Terminated, KeyboardInterrupt) as stop:
        return stopped_while_loading(stop, output)
    try:
        return train(config, run_dir, module, batches, args, argv)
    finally:
        if run_dir.lock is not None:
            run_dir.lock.release()


def stopped_while_loading(stop: BaseException, output: OutputState | None) -> int:
    """SIGTERM, SIGHUP or Ctrl-C before the fit: ``output_dir`` put back as it was, one line (from rank 0), 143, 129
    or 130."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    code, outcome, cause = stop_outcome(stop)
    if rank_zero_only.rank == 0:
        where = output.restore() if output is not None else "output_dir was not touched"
        print(f"run {outcome} before its first step: {cause} while loading; nothing was trained, {where}", flush=True)
    return code


def set_loudness(quiet: bool, verbose: bool) -> None:
    """``--quiet``: warnings and errors only (the summary is printed, not logged); ``--verbose``: klear's debug
    lines, and the third-party lines a run filters by default (`klear.run.console`). The ranks after the first print
    klear's warnings and errors only: their information lines (the data read, the threads) repeat rank 0's."""
    import logging

    from klear.run.console import quiet_third_party

    if verbose:
        logging.getLogger("klear").setLevel(logging.DEBUG)
        return
    if quiet:
        logging.getLogger().setLevel(logging.WARNING)
    elif not launching_process():
        logging.getLogger("klear").setLevel(logging.WARNING)
    quiet_third_party(logging.WARNING if quiet else logging.INFO)


def train(
    config: DictConfig, run_dir: RunDir, module, batches, args: argparse.Namespace, argv: list[str] | None
) -> int:
    """Fit, then write ``report.md`` and ``curves.png`` and print the closing summary however the run ended:
    finished (exit 0), stopped by ``rollout.logprob_gap_stop`` (3), by a loss, gradient norm or log-prob that is not
    finite (4, before the update commits: `klear.run.stopping.check_finite`), interrupted with Ctrl-C (130), stopped by
    SIGTERM (143), SIGHUP (129) or SIGUSR1 (138; every rank at the same step or update: `klear.run.stopping`), a
    write that failed (a full disk: one line, exit 1), settings an engine refuses as it starts (a `UserError`: one line,
    exit 2) or failed otherwise (1: `failed`). The last complete checkpoint
    is kept in every case, and a report that cannot be written never hides how the run ended."""
    import time

    from klear.rollout.refresh import LogprobGapError
    from klear.run.out_of_memory import is_out_of_memory
    from klear.run.out_of_memory import status as oom_status
    from klear.run.rank_failure import Failure, RankFailures, watch_started_ranks
    from klear.run.stopping import EXIT_DIVERGED, Diverged, SignalStop, StopRequested
    from klear.runtime import lightning_compat, memory
    from klear.runtime.distributed import RankFailure

    first_step = run_dir.resume_step() if args.resume else 0  # read now: the run replaces the checkpoint
    started, code, outcome, detail, failure, steps = time.perf_counter(), 0, "finished", "", None, None
    resume = resume_command(argv)

    def exit_at_once(status: str, error: str | None = None, with_report: bool = False) -> None:
        """Rank 0's end of a run that a watcher thread ends while the main thread is blocked: its error line, the
        report (when asked), the summary; every rank's lock released (the exit that follows skips main's release)."""
        if trainer is None:  # still being built: nothing of the run to report
            return
        if trainer.is_global_zero:
            for partial in run_dir.checkpoints.glob("*.tmp"):  # a save cut short: never mistaken for a checkpoint
                remove_path(partial)
            if error is not None:
                print(f"error: {error}", file=sys.stderr, flush=True)
            seconds = time.perf_counter() - started
            if with_report:
                report(run_dir, config, seconds, status, first_step, must_succeed=False)
            print(run_summary(run_dir, status, seconds, first_step, resume, config.trainer.best_metric), flush=True)
        if run_dir.lock is not None:
            run_dir.lock.release()

    def forced_exit(reason: str) -> None:  # a stop signal, and no stop within the grace
        exit_at_once(f"stopped at step {lightning_compat.completed_steps(trainer)}: {stop.cause.name} ({reason})")

    def peer_failed(failure: Failure) -> None:  # another rank failed, and this one is blocked in a collective
        status = f"failed at step {lightning_compat.completed_steps(trainer)}: {failure.describe()}"
        exit_at_once(status, failure.line(), with_report=True)

    def described(error: BaseException) -> tuple[str, str]:  # a failure as rank 0 reports it for this rank
        if is_out_of_memory(error):
            return "", oom_status(error, memory.raised_in(error), config)
        return type(error).__name__, first_line(error)

    stop, trainer = SignalStop(forced_exit), None
    agreed = (StopRequested, LogprobGapError, Diverged, RankFailure)  # raised by every rank together
    failures = RankFailures(peer_failed, stop.closing, agreed, describe=described)
    lightning_compat.observe_started_ranks(watch_started_ranks)
    with stop.watching():  # from here on, a stop signal stops the ranks together, at the first step at the latest
        trainer = build_trainer(config, run_dir, resume=args.resume, extra_callbacks=[stop, failures])
        try:
            checkpoint = str(run_dir.last_checkpoint) if args.resume else None
            failures.open()
            trainer.fit(module, train_dataloaders=batches, ckpt_path=checkpoint, weights_only=False)  # our own files
        except StopRequested as error:  # SIGTERM, SIGHUP or a first Ctrl-C, agreed by every rank
            code, outcome, detail = stop.outcome()
            steps = error.completed
        except LogprobGapError as error:
            print(f"error: {error}", file=sys.stderr)
            code, outcome, detail = 3, "stopped", f": {first_line(error)}"
        except Diverged as error:  # every rank, at the same update, before its optimizer step
            if trainer.is_global_zero:
                print(f"error: {diverged(error, lightning_compat.completed_steps(trainer), config)}", file=sys.stderr)
            code, outcome, detail = EXIT_DIVERGED, "stopped", f": {error}"
        except SystemExit:  # Lightning answers Ctrl-C with a graceful shutdown, then sys.exit(1)
            if not trainer.interrupted:
                raise
            code, outcome = EXIT_INTERRUPTED, "interrupted"
            if stop.signalled.is_set():  # a second Ctrl-C; or rich exited on an output pipe broken as the run stopped
                code, outcome, detail = stop.outcome()
        except OSError as error:  # a full disk, a quota: what to do is one line, not a traceback
            shared = isinstance(error, RankFailure)  # every rank has it: rank 0 reports it
            if trainer.is_global_zero or not shared:
                print(f"error: {write_failure(error, run_dir.root)}", file=sys.stderr)
            kind = f"OSError on rank {error.rank}" if shared else type(error).__name__
            code, outcome, detail = 1, "failed", f": {kind}: {first_line(error)}"
        except Exception as error:
            code, outcome = (2 if isinstance(error, UserError) else 1), "failed"
            detail, failure = failed(error, trainer, failures, config)
        finally:
            failures.close()
        with stop.closing:  # a forced exit from here on would print a second summary
            steps = lightning_compat.completed_steps(trainer) if steps is None else steps
            status = outcome if code == 0 else f"{outcome} at step {steps}{detail}"
            if trainer.is_global_zero:
                seconds = time.perf_counter() - started
                report(run_dir, config, seconds, status, first_step, must_succeed=code == 0 and failure is None)
                resumed = None if code == 0 else resume
                print(run_summary(run_dir, status, seconds, first_step, resumed, config.trainer.best_metric))
    if failure is not None:
        raise failure
    return code


def failed(error: Exception, trainer, failures, config: DictConfig) -> tuple[str, Exception | None]:
    """The status detail of a run that ``error`` ended on this rank, and the exception to raise after the summary
    (its traceback), if any. On several ranks the first rank's failure is the run's (`klear.run.rank_failure`):
    a rank that failed because another did prints no traceback, and rank 0 names that rank in one line. An
    allocation that failed is one line with what to lower instead of a traceback (`klear.run.out_of_memory`), and so
    is a `UserError` (settings that the engine refuses as it starts)."""
    from klear.run.out_of_memory import is_out_of_memory, out_of_memory_line, status
    from klear.run.rank_failure import PEER_WAIT_S
    from klear.runtime import lightning_compat, memory

    first = failures.first(wait_s=PEER_WAIT_S if trainer.world_size > 1 else 0.0)
    if first is not None and first.rank != trainer.global_rank:  # this rank failed because another did
        if trainer.is_global_zero:
            print(f"error: {first.line()}", file=sys.stderr)
        return f": {first.describe()}", None
    rank = f"rank {trainer.global_rank}" if trainer.world_size > 1 else ""
    if is_out_of_memory(error):
        phase, step = memory.raised_in(error), lightning_compat.completed_steps(trainer)
        print(f"error: {rank + ': ' if rank else ''}{out_of_memory_line(error, phase, config, step)}", file=sys.stderr)
        return f": {status(error, phase, config)}{' on ' + rank if rank else ''}", None
    if isinstance(error, UserError):  # settings found wrong once the run started (an engine's): one line, exit 2
        print(f"error: {rank + ': ' if rank else ''}{first_line(error)}", file=sys.stderr)
        return f": {first_line(error)}{' on ' + rank if rank else ''}", None
    return f": {type(error).__name__}{' on ' + rank if rank else ''}: {first_line(error)}", error


def diverged(error: Exception, step: int, config: DictConfig) -> str:
    """The one line of a run stopped by a metric that is not finite (`klear.run.stopping.Diverged`)."""
    return (
        f"{error} at step {step}: the training diverged (a learning rate too high is the usual cause: optim.lr = "
        f"{config.optim.lr:g}); step {step} is discarded, nothing of it is saved"
    )


def report(run_dir: RunDir, config: DictConfig, seconds: float, status: str, first_step: int, must_succeed: bool):
    """``report.md`` and ``curves.png``; when the run did not finish, a report that cannot be written (the disk
    that stopped the run is full) is one warning line, so that the run's own error and summary still show."""
    from klear.run.report import write_run_report

    try:
        write_run_report(run_dir.root, config, seconds, status, first_step)
    except Exception as error:
        if must_succeed:
            raise
        reason = write_failure(error, run_dir.root) if isinstance(error, OSError) else first_line(error)
        print(f"warning: the run's report was not written: {reason}", file=sys.stderr)


def start(config: DictConfig, resume: bool, overwrite: bool) -> tuple[RunDir, object, object]:
    """Hold ``output_dir`` (the job's first process: `klear.run.folder_lock`), check it against ``--resume`` /
    ``--overwrite``, build the stage (which checks every data row), and only then write ``config.yaml`` and remove
    the run ``--overwrite`` replaces. A start refused anywhere on the way leaves ``output_dir`` as it found it: the
    ``data_report.json`` the build wrote is put back, and a folder the lock made is removed."""
    first = launching_process()
    lock = RunDir(config.output_dir).take_lock("klear.fit") if first else None
    report = RunDir(config.output_dir).data_report
    kept = report.read_bytes() if lock is not None and report.is_file() else None
    try:
        run_dir = check_run_dir(config, resume, overwrite)
        run_dir.lock = lock
        module, batches = build_stage(config, run_dir)
        config.trainer.max_steps = len(batches)  # as the stage fixed it: SFT's trainer.epochs count it from the data
        if first:  # the other ranks write through rank 0
            begin_run(config, run_dir, resume, overwrite)
    except BaseException:
        if lock is not None:
            put_back(report, kept)
            lock.release(undo=True)
        raise
    return run_dir, module, batches


def prepare_run_dir(config: DictConfig, resume: bool, overwrite: bool) -> RunDir:
    """`check_run_dir`, then `begin_run`: the run directory of a run built and trained by hand (without the
    lock and the refused-start guarantees of `start`)."""
    run_dir = check_run_dir(config, resume, overwrite)
    begin_run(config, run_dir, resume, overwrite)
    return run_dir


def check_run_dir(config: DictConfig, resume: bool, overwrite: bool) -> RunDir:
    """The output directory, checked writable and against ``--resume`` / ``--overwrite`` (`check_output`)."""
    run_dir = RunDir(config.output_dir, resume=resume)
    run_dir.check_writable()
    check_output(run_dir, config, resume, overwrite)
    return run_dir


def check_output(run_dir: RunDir, config: DictConfig, resume: bool, overwrite: bool) -> None:
    """Check what the output directory holds against ``--resume`` / ``--overwrite`` (a resume: that its last
    checkpoint is complete and the config changed only in `RESUMABLE_CHANGES`), reading only: `main` asks before the
    data files are read, so a start refused for it is refused at once whatever the data's size, and `start` again
    under the directory's lock."""
    if resume:
        run_dir.check_resumable()
        changed = {key for key in _changed_keys(read_yaml(run_dir.config), config) if not _resumable(key)}
        if changed:
            raise RunError(
                f"--resume: the config differs from the run's {run_dir.config} in {', '.join(sorted(changed))}; "
                f"only {', '.join(sorted(RESUMABLE_CHANGES))} may change"
            )
    elif run_dir.holds_a_run() and not overwrite:
        root = str(run_dir.root)
        if run_dir.last_checkpoint is None:  # --resume would have nothing to continue from
            raise RunError(
                f"output_dir {root!r} holds a run that stopped before its first complete checkpoint, so nothing can "
                f"be resumed; start it again with --overwrite, or set output_dir=..."
            )
        raise RunError(
            f"output_dir {root!r} already holds a run; continue it with --resume, replace it with --overwrite, or "
            f"set output_dir=..."
        )


def begin_run(config: DictConfig, run_dir: RunDir, resume: bool, overwrite: bool) -> None:
    """Write ``config.yaml``; with ``--overwrite``, first remove the checkpoints and ``metrics.csv`` of the run it
    replaces."""
    if overwrite and not resume:
        for stale in [*run_dir.checkpoints.glob("*.ckpt"), run_dir.metrics]:
            remove_path(stale)
    save_config(config, run_dir.config)


def run_summary(
    run_dir: RunDir,
    status: str,
    seconds: float,
    first_step: int = 0,
    resume: str | None = None,
    best_metric: str = "eval/accuracy",
) -> str:
    """The closing lines of a run: how it ended, where ``eval/accuracy`` went (best at which step; and each eval
    set's), the time, the data rows skipped, where the outputs are, and the command that resumes it (when it did not
    finish)."""
    from klear.run.report import (
        accuracy_course,
        duration,
        eval_flags,
        eval_set_courses,
        kept_checkpoints,
        read_data_report,
        read_metrics,
        steps_logged,
    )

    rows = read_metrics(run_dir.metrics)
    evals = accuracy_course(rows)
    report = read_data_report(run_dir.data_report)
    steps = steps_logged(rows) - first_step
    rate = f", {steps / seconds:.2f} steps/s" if seconds > 0 and steps > 0 else ""
    lines = [f"run {status}: {steps} step{'' if steps == 1 else 's'} in {duration(seconds)}{rate}"]
    if evals:
        best_step, best = max(evals, key=lambda item: item[1])
        lines.append(f"eval/accuracy {evals[0][1]:.3f} -> {evals[-1][1]:.3f} (best {best:.3f} at step {best_step})")
    if courses := eval_set_courses(rows, report):
        lines.append(f"eval/accuracy of each set: {courses}")
    skipped = {name: source["skipped"] for name, source in report.items() if source.get("skipped")}
    if skipped:
        counts = ", ".join(f"{count} of {report[name]['rows']} {name} rows" for name, count in skipped.items())
        lines.append(f"skipped {counts} (each by file and line in {run_dir.data_report})")
    model = f"model: {run_dir.hf}; " if (run_dir.hf / "config.json").is_file() else ""
    if model and (run_dir.adapter / "adapter_config.json").is_file():  # a LoRA run: hf/ is the merged model
        model = f"model: {run_dir.hf} (merged), adapter: {run_dir.adapter}; "
    lines.append(f"{model}metrics: {run_dir.metrics}; report: {run_dir.root / 'report.md'} (curves.png)")
    kept = [entry for entry in kept_checkpoints(run_dir.root, rows, best_metric) if entry["score"] is not None]
    if len(kept) > 1:  # a choice of models: the best scored one
        best = max(kept, key=lambda entry: entry["score"])
        lines.append(
            f"{len(kept)} scored checkpoints kept, the best {best['path']} ({best_metric} {best['score']:.3f} at step "
            f"{best['step']}): each is a model for --model and model.path"
        )
    if model and (flags := eval_flags(report)) is not None:
        lines.append(f"evaluate it as it was trained: python -m klear.eval --model {run_dir.hf} --data FILE {flags}")
    if resume and run_dir.last_checkpoint is not None:
        lines.append(f"nothing is lost: {run_dir.last_checkpoint} is kept; resume with: {resume}")
    elif resume:
        lines.append(f"no checkpoint was completed: start again with: {resume.removesuffix(' --resume')} --overwrite")
    return "\n".join(lines)


def resume_command(argv: list[str] | None) -> str:
    """The command line that continues this run: the same arguments, with ``--resume`` (and no ``--overwrite``)."""
    import shlex

    args = [arg for arg in (sys.argv[1:] if argv is None else argv) if arg not in ("--overwrite", "--resume")]
    return shlex.join(["python", "-m", "klear.fit", *args, "--resume"])


def build_stage(config: DictConfig, run_dir: RunDir):
    """The stage's LightningModule and its batches, by the stage's ``build(config, run_dir)``."""
    # Imported here, not at the top: the config, the output directory and the machine are checked before torch
    # and Lightning are imported.
    from klear.stages import rl, sft

    build = {"sft": sft.build, "rl": rl.build}[config.stage]  # config.stage is checked against the schemas
    try:
        return build(config, run_dir)
    except OSError as error:  # transformers: a hub name that is not cached and cannot be downloaded, broken files
        raise RunError(f"model.path = {config.model.path!r} cannot be loaded: {first_line(error)}") from error


def build_trainer(config: DictConfig, run_dir: RunDir, resume: bool, extra_callbacks: list | None = None):
    import lightning as L

    from klear.run.checkpoints import StepCheckpoint
    from klear.run.metrics_log import MetricsCSVLogger
    from klear.run.progress import StepProgressBar
    from klear.run.stopping import cluster_plugins
    from klear.runtime.device import default_precision, uses_cuda
    from klear.runtime.strategies import build_strategy

    loggers = [MetricsCSVLogger(run_dir.root, resume_step=run_dir.resume_step() if resume else None)]
    if config.logging.tensorboard:
        from lightning.pytorch.loggers import TensorBoardLogger

        loggers.append(TensorBoardLogger(str(run_dir.root), name="tensorboard", version=""))
    if config.logging.wandb:
        from lightning.pytorch.loggers import WandbLogger

        loggers.append(WandbLogger(project=config.logging.wandb_project, save_dir=str(run_dir.root)))
    callbacks = [*(extra_callbacks or []), StepCheckpoint(run_dir, config.trainer)]
    if config.trainer.progress_bar:
        callbacks.append(StepProgressBar())
    return L.Trainer(
        accelerator="gpu" if uses_cuda(config.trainer.accelerator) else "cpu",
        devices=config.trainer.devices,
        num_nodes=config.trainer.num_nodes,
        strategy=build_strategy(config),
        plugins=cluster_plugins(),
        precision=default_precision(config),
        max_epochs=1,
        max_steps=-1,
        logger=loggers,
        callbacks=callbacks,
        enable_checkpointing=True,  # StepCheckpoint is the run's checkpoint: Lightning adds none of its own
        enable_progress_bar=config.trainer.progress_bar,
        enable_model_summary=False,
        log_every_n_steps=config.trainer.log_every_n_steps,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=str(run_dir.root),
    )


def _changed_keys(old: DictConfig, new: DictConfig) -> set[str]:
    """The dotted keys whose values differ. A key the old config does not hold (written by a klear that did not
    have it yet) differs only when its new value is not the default, which the old run ran with."""
    from klear.schema import SCHEMAS

    a, b = _flatten(old), _flatten(new)
    defaults = _flatten(OmegaConf.structured(SCHEMAS[new.stage]))
    return {
        key
        for key in a.keys() | b.keys()
        if a.get(key) != b.get(key) and not (key not in a and key in defaults and b.get(key) == defaults[key])
    }


def _resumable(key: str) -> bool:
    """Whether a changed dotted key is one of `RESUMABLE_CHANGES` or inside one (``data.eval.aime24`` of a mapping)."""
    return any(key == allowed or key.startswith(f"{allowed}.") for allowed in RESUMABLE_CHANGES)


def _flatten(config: DictConfig) -> dict[str, object]:
    """Dotted key -> plain value, through YAML so that tuples and lists compare equal."""
    flat: dict[str, object] = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = node

    walk(OmegaConf.to_container(OmegaConf.create(OmegaConf.to_yaml(config))), "")
    return flat


if __name__ == "__main__":
    from klear import cli

    cli.run(main)
