import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # cases.py, shared with bench/bench_refusals.py
