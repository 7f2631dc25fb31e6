"""Output, the pipeline's last stage (write.py): a report as one ordered list of sections
(sections.py), rendered to summary.json, report.md and the console from the same data;
and the plots."""
