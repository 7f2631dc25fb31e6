"""Run: the timed requests (sequential.py, then concurrent.py), their traces (trace.py) and
records (records.py), a sweep over target and draft models that writes every output
(sweep.py), and the manifest of what ran on what (manifest.py)."""
