"""What a run needs of this machine, checked before its output directory is written and before anything heavy is
imported: ``klear.fit`` calls `preflight` right before it prepares the run directory, so a run that cannot start
leaves no ``config.yaml`` behind and says why in one line.

- ``trainer.accelerator=gpu`` needs a CUDA GPU that torch sees (torch is imported for that question only);
- the ``vllm`` engine (``rollout.engine``, SFT's ``eval.engine``) needs vLLM installed; the config itself loads
  without it, so ``klear.data tokenize`` fills an SFT run's cache on a machine without vLLM;
- ``model.attn_implementation=flash_attention_2`` needs the flash-attn package and a GPU;
- ``model.lora.target_modules`` must name linear layers the model has (its architecture is built on the meta
  device: nothing is allocated or read but its config);
- ``trainer.num_nodes > 1`` needs a launcher that starts the other nodes' processes and tells this one where the
  first node is: without one, the rendezvous waits for nodes that never come, without a word. The launchers are
  the ones Lightning's cluster environments detect (`lightning.fabric.plugins.environments`): SLURM's ``srun``,
  torchrun (torchelastic), LSF's ``jsrun``, MPI, and Lightning's own, ``MASTER_ADDR`` and ``NODE_RANK`` set on each
  node by hand;
- a run's checkpoint as ``model.path`` must export as a model (`check_model`; transformers is imported for it);
- the data files (`klear.data.preflight`).
"""

from __future__ import annotations

import importlib.util
import os

from omegaconf import DictConfig

from klear.config.load import ConfigError
from klear.data.preflight import check_data
from klear.errors import first_line
from klear.rollout.engine import missing_engine

LAUNCHERS: dict[str, tuple[str, ...]] = {
    "SLURM (srun)": ("SLURM_NTASKS",),
    "torchrun": ("TORCHELASTIC_RUN_ID",),
    "LSF (jsrun)": ("LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE"),
    "MPI (mpirun)": ("OMPI_COMM_WORLD_SIZE",),
    "MPI (PMI)": ("PMI_SIZE",),
    "MASTER_ADDR and NODE_RANK": ("MASTER_ADDR", "NODE_RANK"),
}
"""Launcher -> the environment variables that say it started this process (all of them), as Lightning detects it.
SLURM counts unless the job is named ``bash`` or ``interactive`` (Lightning's way to opt out of it)."""


def preflight(config: DictConfig) -> None:
    """Raise `ConfigError` (or `klear.data.readers.DataError`) with one line when this machine cannot run
    ``config``: the checks of the module docstring."""
    check_machine(config)
    check_model(config)
    check_data(config, keep=True)  # what the stage reads next, checked


def check_model(config: DictConfig) -> None:
    """A run's checkpoint as ``model.path`` is exported here (`klear.models.run_checkpoint`), once, by the job's
    first process: one that cannot be (no klear checkpoint, weights that do not fit its run's model, that model gone)
    stops the run in one line before anything is written."""
    from klear.runtime.checkpoint_files import is_run_checkpoint

    if not is_run_checkpoint(config.model.path):
        return
    from klear.models import resolve_model_path

    try:
        resolve_model_path(config.model.path)
    except (OSError, ValueError) as error:
        raise ConfigError(f"model.path = {config.model.path!r}: {first_line(error)}") from error


def check_machine(config: DictConfig) -> None:
    """The accelerator, the engine's package, the attention kernel and the launcher that ``config`` asks for."""
    trainer = config.trainer
    if trainer.accelerator == "gpu":
        import torch  # the only way to ask; a run on a GPU imports it next anyway

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(
                "trainer.accelerator=gpu, but torch sees no CUDA GPU on this machine (a CPU build of torch, no "
                "driver, or CUDA_VISIBLE_DEVICES empty); set trainer.accelerator=cpu or auto"
            )
        if trainer.devices > count:
            raise ConfigError(f"trainer.devices = {trainer.devices}, but this machine has {count} CUDA GPUs")
    engine = ("rollout.engine", config.rollout.engine) if config.stage == "rl" else ("eval.engine", config.eval.engine)
    if problem := missing_engine(*engine):
        raise ConfigError(problem)
    if config.model.attn_implementation == "flash_attention_2":
        if importlib.util.find_spec("flash_attn") is None:
            raise ConfigError(
                "model.attn_implementation=flash_attention_2 needs the flash-attn package (pip install flash-attn "
                "on a CUDA machine); or set model.attn_implementation=sdpa"
            )
        if trainer.accelerator == "cpu":
            raise ConfigError("model.attn_implementation=flash_attention_2 runs on GPUs; on a CPU use sdpa")
    if config.model.lora is not None:
        from klear.models import hf_config
        from klear.models.lora import target_problem

        problem = target_problem(config.model.lora, hf_config(config.model))
        if problem:
            raise ConfigError(problem)
    if trainer.num_nodes > 1 and launcher() is None:
        raise ConfigError(
            f"trainer.num_nodes = {trainer.num_nodes}, but no multi-node launcher started this process, so it would "
            f"wait for {trainer.num_nodes} nodes that never come; launch it on every node with srun (SLURM) or "
            "torchrun --nnodes, or set MASTER_ADDR, MASTER_PORT and NODE_RANK on each; on one machine set "
            "trainer.num_nodes=1"
        )


def launcher(environ: dict[str, str] | None = None) -> str | None:
    """The multi-node launcher whose environment variables this process has (`LAUNCHERS`), or None."""
    environ = dict(os.environ if environ is None else environ)
    if environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        environ.pop("SLURM_NTASKS", None)
    return next((name for name, keys in LAUNCHERS.items() if all(key in environ for key in keys)), None)
