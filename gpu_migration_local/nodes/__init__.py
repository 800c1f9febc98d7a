"""Real kubelet nodes for the local environment: a kubelet and its own containerd per node, each in its own mount
namespace, cgroup root and CNI bridge (room.py, node.py), with every host change recorded and undone (host.py)."""
