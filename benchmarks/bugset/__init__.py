"""Real bugs from peers' trackers, re-implemented with their upstream-fixed twins (benchmarks/bugset/run.py
measures how many gramcheck catches and how many fixed twins it fails)."""
