"""Tracking: the one place that knows how qkstudy's records sit in MLflow.

Why a module of its own: the runner writes runs and the report reads them, often years and
versions apart; both must agree on tag names, statuses and URIs, and no URI with a secret in
it may reach a log, a report or an error message. Everything that touches those conventions
imports them from here.
"""
