"""Closed-loop autoscaling experiment (docs/autoscaling.md): one command.

.venv/bin/python bench/autoscale.py --out autoscale-out          # ~18 min, 5 policies
.venv/bin/python bench/autoscale.py --policies gpu-util,shipped --scale 0.5
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.autoscaling.main import main

if __name__ == "__main__":
    sys.exit(main())
