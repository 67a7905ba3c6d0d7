"""Fixtures of the scale suite: the cluster and the node image (corral_cluster.py)."""

from corral_cluster import cluster, node_image  # noqa: F401 - fixtures, found by name
