"""The Kubernetes side: checks over the live cluster and the dynamic resources that act on nodes, one concern a module."""
