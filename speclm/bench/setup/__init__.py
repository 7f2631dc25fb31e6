"""Set-up, the pipeline's first stage: what a bench run sends (workloads), with which
methods, swept how (config), on which models (plan)."""
