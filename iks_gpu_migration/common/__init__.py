"""Helpers every floor uses: version strings, Kubernetes object names, bounded waits."""
