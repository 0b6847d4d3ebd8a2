"""``--profile cprofile|torch`` of the step benchmarks (``bench_rl_step.py``, ``bench_sft_step.py``): klear's steps
after the warm-up, profiled, and the table printed after the last one."""

from __future__ import annotations


class StepProfiler:
    """Starts after step ``warmup - 1`` and prints its table after step ``total - 1`` (0-based step indices)."""

    def __init__(self, kind: str, warmup: int, total: int) -> None:
        self.kind, self.warmup, self.total = kind, warmup, total
        self.profile = None

    def step_done(self, index: int) -> None:
        if index == self.warmup - 1:
            if self.kind == "cprofile":
                import cProfile

                self.profile = cProfile.Profile()
                self.profile.enable()
            else:
                import torch.profiler

                self.profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                self.profile.start()
        elif index == self.total - 1 and self.profile is not None:
            steps = self.total - self.warmup
            if self.kind == "cprofile":
                import pstats

                self.profile.disable()
                stats = pstats.Stats(self.profile).strip_dirs()
                print(f"cProfile over {steps} klear steps (seconds are totals over those steps)")
                stats.sort_stats("tottime").print_stats(30)
                stats.sort_stats("cumulative").print_stats(45)
            else:
                self.profile.stop()
                print(f"torch.profiler over {steps} klear steps")
                print(self.profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=35))
