"""Reads of the whole cluster that a batch's k nodes ask for at once, made once for all of them.

After each node, its path switch checks every GPU Operator pod against every node's kubelet (kube/operands.py) and
lists the Pending GPU pods; before each drain, the budget reads every Node (kube/drain_budget.py). A batch's k nodes
reach these steps within moments of each other, so the provider process read the whole cluster k times at once,
O(k·N) objects per batch and seconds of CPU in a process whose threads share one interpreter.

`Coalesced.call(key, read)` returns the result of a read that *started after the caller asked*: as fresh as its own
would be, so every decision taken on it is the one it would take alone (the single-flight pattern of Go's
golang.org/x/sync/singleflight, made safe for "read the state now" callers by never handing out a read that was
already under way). Callers that arrive while a read runs share the next one: at most two reads per key at a time.
An error of a read is raised in every caller that shares it.

A caller waits for another's read at most `wait` seconds (READ_WAIT): its requests have timeouts (kube/clients.py),
so a read that runs longer is stuck, and the caller raises SharedReadTimeout naming the read rather than wait on.
"""
import threading
import time
from typing import Any, Callable, Hashable, TypeVar

T = TypeVar("T")

# A read is a few LISTs of the whole cluster (paginated Nodes or Pods), each request bounded by kube/clients.py's
# timeouts (10 s to connect, 70 s per read, a read timeout retried once): five minutes is several such requests'
# worst case, and hours more than such a read takes on a large cluster.
READ_WAIT = 300.0


class SharedReadTimeout(TimeoutError):
    """A caller waited longer than its bound for a read another caller runs."""


def _name(key: Hashable) -> str:
    """What a key reads, for people: its words (e.g. "operand-placement gpu-operator 1.36"), not a client's id()."""
    parts = key if isinstance(key, tuple) else (key,)
    return " ".join(str(p) for p in parts if isinstance(p, str)) or repr(key)


class _Key:
    def __init__(self) -> None:
        self.started = 0  # reads started for this key
        self.done = 0  # the newest read that finished
        self.running = False
        self.outcome: tuple[bool, Any] = (True, None)  # (ok, result or exception) of read `done`


class Coalesced:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._keys: dict[Hashable, _Key] = {}

    def call(self, key: Hashable, read: Callable[[], T], wait: float = READ_WAIT) -> T:
        """`read`'s result, or a shared one's that started after this call; waits for another caller's read at most
        `wait` seconds (then SharedReadTimeout)."""
        deadline = time.monotonic() + wait
        with self._changed:
            k = self._keys.setdefault(key, _Key())
            wanted = k.started + 1  # a read under way started before this call: not fresh enough for it
            while k.done < wanted:
                left = deadline - time.monotonic()
                if not k.running:
                    self._run(k, read)
                elif left <= 0:
                    raise SharedReadTimeout(
                        f"gave up after {wait:.0f}s waiting for the shared read of {_name(key)} that another step of "
                        f"this process runs (a read of the cluster that got no answer?); re-running `pulumi up` "
                        f"reads again")
                else:
                    self._changed.wait(left)
            ok, value = k.outcome
        if not ok:
            raise value
        return value

    def _run(self, k: _Key, read: Callable[[], Any]) -> None:
        """Runs `read` outside the lock (held on entry and on return) as the key's next read; records its outcome."""
        k.started += 1
        mine, k.running = k.started, True
        self._changed.release()
        try:
            outcome = (True, read())
        except BaseException as e:  # noqa: BLE001 - handed to every caller that shares the read
            outcome = (False, e)
        finally:
            self._changed.acquire()
        k.running, k.done, k.outcome = False, mine, outcome
        self._changed.notify_all()


# The provider process's shared reads (keyed by what they read and with which kubeconfig).
READS = Coalesced()
