"""Look-back.

Per-step metrics, the metric history, alert rules, HTML reports and plots, and rebuilding them
from stored runs.
"""
