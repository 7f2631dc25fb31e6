"""Run, the pipeline's second stage: every target's turn (sweep.py) on models loaded in
turn or given (models.py), the timed requests (sequential.py, then concurrent.py), their
traces (trace.py) and records (records.py), and the manifest of what ran on what
(manifest.py)."""
