"""The IKS side: the API client (api.py) and the dynamic resources that act on the master and workers."""
