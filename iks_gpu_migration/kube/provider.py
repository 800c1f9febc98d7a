"""The base of the dynamic resources that check and act on the live cluster with the official kubernetes client.

Each provider takes its ApiClient per call from `kubeconfig` (None: KUBECONFIG or ~/.kube/config), shared within the
provider host process (clients.py): providers are dill-serialized into the state (by reference to their module and
class; see state_compat.py), so they hold no clients. Every wait is bounded (common/waiting.py); a failed check fails
`up` with a message naming the node, pod or device, and the next `up` retries it.
"""
import time
from typing import Any, Optional, Sequence

from kubernetes.client.exceptions import ApiException
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from ..common.waiting import WaitTimeout, optional_float, wait_for
from .clients import api_client
from .refusals import explained, status_message


class CheckFailed(Exception):
    """A cluster check did not pass; the message lists what was seen."""


def _bullets(problems: Sequence[str]) -> str:
    return "".join(f"\n  - {p}" for p in problems)


def _short(error: BaseException) -> str:
    """One line for an error: an API error keeps its status and Kubernetes' own message (which names, for a refusal,
    the user, the verb and the resource)."""
    if isinstance(error, ApiException):
        message = status_message(error)
        return f"HTTP {error.status} {error.reason}" + (f": {message}" if message else "")
    return " ".join(str(error).split())[:200] or type(error).__name__


class _Provider(ResourceProvider):
    """create() runs the check; a change of any input in `rerun_on` replaces the resource (runs it again)."""

    rerun_on: tuple[str, ...] = ()
    # The pickled provider names its module and class and holds nothing else (state_compat.py), so it is stored as
    # it is: the SDK still makes it a secret if it captured a secret (pulumi/dynamic/dynamic.py Resource.__init__).
    serialize_as_secret_always = False
    # The inputs the outputs repeat (None: all). A provider that lists them keeps what its diff, read and delete use;
    # the rest only steers a run (timeouts, a check pod's settings), is read from the new inputs when one runs, and
    # changes nothing by itself. Each repeated input costs every state save its bytes, once per node.
    kept: Optional[tuple[str, ...]] = None

    def run(self, api, props: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _kept(self, props: dict[str, Any]) -> dict[str, Any]:
        return props if self.kept is None else {k: v for k, v in props.items() if k in self.kept or k.startswith("__")}

    def create(self, props: dict[str, Any]) -> CreateResult:
        with api_client(props.get("kubeconfig")) as api, explained():
            outs = self.run(api, props)
        return CreateResult(id_=f"{type(self).__name__}-{time.time_ns()}", outs={**self._kept(props), **outs})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [k for k in self.rerun_on if olds.get(k) != news.get(k)]
        # `__provider` is the pickled code, not an input of the check: a move of the code changes nothing to re-run.
        changed = replaces or [k for k in self._kept(news) if not k.startswith("__") and olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=True)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        # Only kept inputs that run nothing again changed (e.g. the kubeconfig): the results stay.
        return UpdateResult(outs={**{k: v for k, v in olds.items() if k not in news}, **self._kept(news)})

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        pass  # checks leave nothing behind


def _timing(props: dict[str, Any], timeout: float) -> dict[str, float]:
    return {"timeout": optional_float(props.get("timeout"), timeout),
            "interval": optional_float(props.get("poll_interval"), 15)}


def _wait_until_no_problems(what: str, check, props: dict[str, Any], default_timeout: float) -> None:
    def poll():
        problems = check()
        return not problems, problems, "; ".join(problems)

    timing = _timing(props, default_timeout)
    try:
        wait_for(what, poll, **timing)
    except WaitTimeout:
        raise CheckFailed(f"{what} did not pass within {timing['timeout']:.0f}s:{_bullets(check())}") from None


class _EveryUp(_Provider):
    """A read-only check that runs again on every `up` (shown as an update): the cluster changes between runs.
    `run` sees the previous outputs as `props["_previous"]` (none on create)."""

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return DiffResult(changes=True, replaces=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        with api_client(news.get("kubeconfig")) as api, explained():
            return UpdateResult(outs={**news, **self.run(api, {**news, "_previous": olds})})
