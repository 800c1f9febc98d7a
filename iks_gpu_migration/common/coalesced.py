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
"""
import threading
from typing import Any, Callable, Hashable, TypeVar

T = TypeVar("T")


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

    def call(self, key: Hashable, read: Callable[[], T]) -> T:
        with self._changed:
            k = self._keys.setdefault(key, _Key())
            wanted = k.started + 1  # a read under way started before this call: not fresh enough for it
            while k.done < wanted:
                if k.running:
                    self._changed.wait()
                else:
                    self._run(k, read)
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
