#!/usr/bin/env bash
# The benchmark-only environment of tools/bench_rl_step.py: klear (editable) + TRL, in /tmp/venv-trl.
#
# TRL is never a dependency of klear; it lives only here. TRL 1.16.0 (the newest release when this was written)
# declares transformers>=4.56.2 and no upper bound, so it installs beside klear's transformers>=5.16.1,<5.20
# without pulling another transformers; the constraint below keeps it that way. torch comes first and pinned:
# `pip install torch==2.13.0` takes the CPU wheel from the local wheel folder (an unpinned torch could pull a
# CUDA build). vLLM is not installed: the benchmark runs TRL's default generation (transformers' generate).
#
#   bash tools/trl_env.sh            # creates /tmp/venv-trl (reused when it already imports trl)
#   /tmp/venv-trl/bin/python tools/bench_rl_step.py
set -euo pipefail

VENV="${TRL_VENV:-/tmp/venv-trl}"
TRL_VERSION="1.16.0"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import trl, klear; assert trl.__version__ == '$TRL_VERSION'" 2>/dev/null; then
    echo "$VENV already holds klear and trl $TRL_VERSION"
    exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet torch==2.13.0
"$VENV/bin/pip" install --quiet -e "$ROOT"
"$VENV/bin/pip" install --quiet "trl==$TRL_VERSION" "torch==2.13.0" "transformers>=5.16.1,<5.20"
"$VENV/bin/python" - <<'EOF'
import torch, transformers, trl, klear  # noqa: F401

assert "+cpu" in torch.__version__ or not torch.cuda.is_available(), torch.__version__
print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}")
EOF
