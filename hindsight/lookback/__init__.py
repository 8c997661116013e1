"""Look-back: per-step metrics, the metric history, alert rules, HTML reports and plots, and rebuilding them from stored runs."""
