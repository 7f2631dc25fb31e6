"""Trust: can a bench figure be believed? A quiet machine before timing (quiet.py),
requests starved of CPU flagged (starvation.py) and re-run (reruns.py) under one
policy (policy.py), and prompts no phase has sent before (phases.py), all as the run
goes; then the pipeline's verdict on the whole run (starvation.starvation_summary). docs/bench.md#trust.
"""
