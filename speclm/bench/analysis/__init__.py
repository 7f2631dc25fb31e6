"""Analysis, the pipeline's fourth stage (figures.py): pure functions from a run's records
to its figures (docs/design.md#metrics): counts, pairs and ratios, group rows and verdicts,
halves, concurrency pairs, the copy ceiling, the SSD projection, Medusa heads, variants,
and model quality."""
