"""The progress bar of a run: training steps (``step 12/30``) and the values a user watches."""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch.callbacks import RichProgressBar


class StepProgressBar(RichProgressBar):
    """Lightning's rich progress bar counting training steps (``step 12/30``), with the values a user watches:
    what the module shows (``reward``, ``eval_acc``, ``loss``, ``kept``) and the seconds per step."""

    def __init__(self) -> None:
        super().__init__(leave=True)
        self._started: float | None = None
        self._steps = 0
        self._final: dict[str, float] = {}

    def _get_train_description(self, current_epoch: int) -> str:
        return "step"

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self._started, self._steps = time.perf_counter(), 0

    def on_train_batch_end(self, trainer, pl_module, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._steps += 1
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_fit_end(self, trainer, pl_module) -> None:
        """Redraw the last frame with the evaluation of the final weights. The module runs it in its
        ``on_train_end``, which Lightning calls after the callbacks' (and where a module cannot ``self.log``), so the
        frame of the last step still shows the previous evaluation while the closing summary gives the final one."""
        final = pl_module.step_metrics.get("eval/accuracy")
        if final is not None:
            self._final = {"eval_acc": final}
            self._update_metrics(trainer, pl_module)
            self.refresh()
        super().on_fit_end(trainer, pl_module)

    def get_metrics(self, trainer, pl_module) -> dict[str, Any]:
        """The module's progress-bar values, and the mean seconds per step of this run so far (evaluations
        included)."""
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        items.update(self._final)
        if self._steps and self._started is not None:
            items["s/step"] = f"{(time.perf_counter() - self._started) / self._steps:.2f}"
        return {key: f"{value:.3f}" if isinstance(value, float) else value for key, value in items.items()}
