"""Fixtures of the scale suite: the cluster (corral_cluster.py)."""

from corral_cluster import cluster  # noqa: F401 - a fixture, found by name
