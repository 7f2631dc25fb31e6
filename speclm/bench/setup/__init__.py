"""Set-up: what a bench run sends (workloads), with which methods, swept how (config)."""
