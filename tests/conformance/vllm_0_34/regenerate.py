"""Rewrite a vLLM release's goldens (default 0.34.0: tests/conformance/goldens_0_34/) and
its comparison.json; the work is tests/conformance/release_goldens.py's (the same
options), which serves every release after 0.33.

    python tests/conformance/vllm_0_34/regenerate.py            # everything (~3 min)
    python tests/conformance/vllm_0_34/regenerate.py --only pp  # one folder
    python tests/conformance/vllm_0_34/regenerate.py --version 0.35 \\
        --drivers tests/conformance/vllm_0_35 --python ~/.cache/kvsched-reference/venv-0.35/bin/python
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from release_goldens import main

if __name__ == "__main__":
    sys.exit(main())
