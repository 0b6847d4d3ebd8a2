"""klear's math verifier against a publisher's grader, on real completions: Qwen2.5-Math's own evaluation example
(``../shared/published/math/qwen25math_math_cot_100.jsonl.gz``: 100 MATH test problems, 8 completions each, with
the harness's verdicts in ``score``), scored as it ships by ``python -m klear.eval`` with the file as both its data
and its completions. The two agree on 799 of the 800 samples; the one they do not is listed with why."""

import gzip
import json

import pytest

from tests.published import PUBLISHED, require
from tests.test_user_errors import klear

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.eval` in a subprocess

DUMP = PUBLISHED / "math" / "qwen25math_math_cot_100.jsonl.gz"


def test_klears_math_verdicts_agree_with_qwens_grader_on_its_published_completions(tmp_path):
    dump = require(DUMP)
    result = klear("klear.eval", "--data", str(dump), "--completions", str(dump), "--k", "8", "--output", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["layout"]["name"] == "math-eval-harness" and (summary["problems"], summary["n"]) == (100, 8)
    compared = summary["saved_verdicts"]
    assert (compared["samples"], compared["agree"]) == (800, 799)
    # The one disagreement: the completion's answer is 10000 and the ground truth is written "10{,}000" (a LaTeX
    # thousands separator). Qwen's grader says no; klear reads both as 10000 and says yes.
    assert compared["disagree"] == [{"line": 73, "sample": 7, "klear": True, "saved": False}]
    rows = [json.loads(line) for line in gzip.decompress(dump.read_bytes()).splitlines()]
    assert rows[72]["gt"] == "10{,}000" and rows[72]["pred"][7] == "10000"
