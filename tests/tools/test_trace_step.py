"""tools/trace_step.py: the step's file count written in docs/architecture.md is what the step does now.

The end-to-end test runs the tool as a user would (a real RL step in a subprocess) with ``--check``; the others
check, on given text, that a difference is found and said in one line, and that ``--doc``'s block round-trips.
"""

import subprocess
import sys

import pytest

from tests.tools import TOOLS, load_tool

TOOL = TOOLS / "trace_step.py"
COUNTS = "one synchronous step: 3 files, 4 transitions, 1 returns, 5 entries"
SUMMARY = f"{COUNTS}\n\nstages/rl.py\nupdate/update.py\nkernels/passes.py"


@pytest.fixture(scope="module")
def tool():
    return load_tool("trace_step")


@pytest.mark.end_to_end
def test_the_documented_step_is_the_step_the_code_runs():
    result = subprocess.run(
        [sys.executable, str(TOOL), "--check"], capture_output=True, text=True, timeout=600, cwd=TOOLS.parent
    )
    assert result.returncode == 0, result.stderr[-2000:]
    counts = result.stdout.strip().splitlines()[-1]
    assert counts.startswith("one synchronous step: ") and counts.endswith(" entries"), result.stdout[-500:]
    documented = load_tool("trace_step").block((TOOLS.parent / "docs" / "architecture.md").read_text())
    assert documented.splitlines()[0] == counts


def test_the_block_round_trips_and_the_text_around_it_stays(tool):
    text = f"# Title\n\nbefore\n\n{tool.BEGIN}\n{tool.END}\n\nafter\n"
    written = tool.with_block(text, SUMMARY)
    assert tool.block(written) == SUMMARY
    assert written.startswith("# Title\n\nbefore\n\n") and written.endswith("\n\nafter\n")
    assert tool.with_block(written, SUMMARY) == written
    assert tool.difference(tool.block(written), SUMMARY) is None


def test_other_counts_are_one_line_naming_both(tool):
    grown = SUMMARY.replace("3 files, 4 transitions", "4 files, 6 transitions") + "\nrun/stopping.py"
    message = tool.difference(SUMMARY, grown)
    assert message == (
        "architecture.md says 3 files, 4 transitions, 1 returns, 5 entries; one synchronous step: 4 files, "
        "6 transitions, 1 returns, 5 entries: run python tools/trace_step.py --doc"
    )


def test_the_same_counts_over_other_files_are_a_difference_too(tool):
    other = SUMMARY.replace("kernels/passes.py", "kernels/logprobs.py")
    message = tool.difference(SUMMARY, other)
    assert message == (
        "architecture.md's files differ from the step's (entered now: ['kernels/logprobs.py'], no longer: "
        "['kernels/passes.py']): run python tools/trace_step.py --doc"
    )
    reordered = SUMMARY.replace("update/update.py\nkernels/passes.py", "kernels/passes.py\nupdate/update.py")
    assert "entered in another order" in tool.difference(SUMMARY, reordered)


def test_a_doc_without_its_block_stops_with_one_line(tool):
    with pytest.raises(SystemExit, match=r"^error: architecture.md needs one <!-- trace_step --> \.\.\. "):
        tool.block("# no block here\n")
