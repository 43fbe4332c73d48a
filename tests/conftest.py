import sys
from pathlib import Path

pytest_plugins = ["pytester"]

# tests/broken.py is importable as 'broken' (and as the CLI target 'broken:NAME')
sys.path.insert(0, str(Path(__file__).parent))
