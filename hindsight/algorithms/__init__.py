"""Advantage estimators and the shared clipped policy-gradient loss, as pure functions."""
