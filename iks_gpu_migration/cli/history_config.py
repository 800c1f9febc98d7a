"""The stack config each update ran with, as `pulumi stack history --json` prints it, against the stack file: what
restoring one would change, and the stack file with that update's `gpu-migration:*` keys written back (cli/history.py).

The CLI records the config of every update (pulumi pkg/backend/updates.go UpdateInfo.Config, a config.Map) and prints
it per key as {value, objectValue, secret} (pkg/cmd/pulumi/stack/stack_history.go configValueJSON, CLI 3.274): a
top-level scalar as its string, an object also parsed (objectValue), a secret with `secret: true` and no value unless
--show-secrets. The file backend keeps a secret's ciphertext in the history file ({"secure": ...}, sdk config/value.go
MarshalJSON), the CLI prints it only decrypted (--show-secrets, never asked for here): secrets are not restored, they
stay as the stack file has them. Pure."""
import io
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import ScalarString

from ..config import NAMESPACE, STAGES
from ..config.loading import SECRET_KEYS


class HistoryError(Exception):
    """The history can't be read or the update can't be restored; the message says which and what to do."""


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


SECRET = _Marker("(secret)")  # a secret: its value is not printed by the CLI
MISSING = _Marker("(unset)")


@dataclass
class Update:
    number: int  # the backend's version, or (every version 0 on a file/DIY backend) the position from the oldest
    kind: str
    result: str
    started: str
    config: dict[str, Any]  # gpu-migration keys without the namespace: program view, SECRET for a secret

    def describe(self) -> str:
        return f"update #{self.number} ({self.kind}, {self.started}, {self.result})"


@dataclass
class Plan:
    """What restoring an update changes in the stack file."""
    nodes: list[str] = field(default_factory=list)  # "node K: stage a -> b", one line per change
    keys: list[str] = field(default_factory=list)  # "gpu-migration:k.sub: a -> b"
    kept: list[str] = field(default_factory=list)  # secrets left as the stack file has them
    writes: dict[str, Any] = field(default_factory=dict)  # top-level key -> new value, or MISSING to remove it


# --- the history ------------------------------------------------------------------------------------------------


def parse_history(data: Any) -> list[Update]:
    """`pulumi stack history --json` (newest first) as Updates, newest first; HistoryError naming a malformed entry."""
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        raise HistoryError("the history is not a JSON list of updates, as `pulumi stack history --json` prints it")
    versions = [e.get("version") for e in data]
    by_version = all(isinstance(v, int) and v > 0 for v in versions) and len(set(versions)) == len(versions)
    updates = []
    for i, entry in enumerate(data):
        config = {} if entry.get("config") is None else entry["config"]
        if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
            raise HistoryError(f"history entry {i} (from the newest): its `config` is not a map of "
                               f"{{value, objectValue, secret}} (got {json.dumps(config)[:120]})")
        updates.append(Update(
            number=entry["version"] if by_version else len(data) - i, kind=str(entry.get("kind", "?")),
            result=str(entry.get("result", "?")), started=str(entry.get("startTime", "?")).replace(".000Z", "Z"),
            config={k.partition(":")[2]: _history_value(v) for k, v in config.items()
                    if k.startswith(f"{NAMESPACE}:")}))
    return updates


def _history_value(entry: dict) -> Any:
    if entry.get("secret"):
        return SECRET
    return entry["objectValue"] if "objectValue" in entry else entry.get("value")


def select(updates: list[Update], number: int, allow_failed: bool) -> Update:
    """The update to restore; HistoryError for an unknown number, a failed one (unless allowed), one without config."""
    found = next((u for u in updates if u.number == number), None)
    if found is None:
        known = f"#{updates[-1].number}-#{updates[0].number}" if updates else "none: nothing was deployed yet"
        raise HistoryError(f"--restore {number}: the stack's history has no update #{number} (updates: {known})")
    if found.result != "succeeded" and not allow_failed:
        raise HistoryError(f"--restore {number}: {found.describe()} did not succeed, so its config may be what broke "
                           f"it; pass --allow-failed to restore it anyway")
    if not [v for v in found.config.values() if v is not SECRET]:
        raise HistoryError(f"--restore {number}: {found.describe()} recorded no {NAMESPACE}:* config to restore")
    return found


def stages(config: dict) -> dict[str, str]:
    """{node key: stage} of a config (a node's key, else its name, as its resources are named)."""
    nodes = config.get("nodes")
    return {_node_key(n): str(n.get("stage")) for n in nodes if isinstance(n, dict)} if isinstance(nodes, list) else {}


def _node_key(node: dict) -> str:
    return str(node.get("key") or node.get("name"))


def stage_summary(config: dict, limit: int = 10) -> str:
    """`dra: a, b; device-plugin: c` in stage order; past `limit` names a stage says how many more."""
    groups: dict[str, list[str]] = {}
    for node, stage in stages(config).items():
        groups.setdefault(stage, []).append(node)
    order = [s for s in STAGES if s in groups] + [s for s in groups if s not in STAGES]
    parts = [f"{s}: {', '.join(groups[s][:limit])}" + (f" (+{len(groups[s]) - limit} more; --json lists every "
                                                       f"node)" if len(groups[s]) > limit else "") for s in order]
    return "; ".join(parts) or f"(no {NAMESPACE}:nodes)"


def same_config(a: dict, b: dict) -> bool:
    """Whether two configs agree on every key that is not a secret."""
    keys = {k for k in (*a, *b) if a.get(k) is not SECRET and b.get(k) is not SECRET and k not in SECRET_KEYS}
    return all(same(a.get(k, MISSING), b.get(k, MISSING)) for k in keys)


def same(a: Any, b: Any) -> bool:
    return _norm(a) == _norm(b)


def _norm(v: Any) -> Any:
    """Comparable form: true is not 1, 1 is 1.0 (Go's JSON prints a float 1.0 as 1), map order does not count."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", float(v))
    if isinstance(v, dict):
        return ("d", tuple(sorted((str(k), _norm(x)) for k, x in v.items())))
    if isinstance(v, list):
        return ("l", tuple(_norm(x) for x in v))
    return ("s", v) if isinstance(v, str) else ("o", repr(v))


def has_secret(v: Any) -> bool:
    """A secure value (`secure: <ciphertext>`, as `pulumi config set --secret` writes it), at any depth."""
    if isinstance(v, dict):
        return list(v) == ["secure"] or any(has_secret(x) for x in v.values())
    return isinstance(v, list) and any(has_secret(x) for x in v)


# --- what restoring changes -------------------------------------------------------------------------------------


def plan(current: dict, target: dict) -> Plan:
    """From the stack file's config (`current`) to an update's (`target`), both program views."""
    out = Plan()
    for key in dict.fromkeys([*current, *target]):
        now, then = current.get(key, MISSING), target.get(key, MISSING)
        if SECRET in (now, then) or key in SECRET_KEYS or has_secret(now):
            if not same(now, then):
                out.kept.append(f"{NAMESPACE}:{key}: a secret, kept as the stack file has it (the history shows "
                                f"no secret's value; set it with `pulumi config set --secret {NAMESPACE}:{key}`)")
            continue
        if same(now, then):
            continue
        out.writes[key] = then
        if key == "nodes" and _node_list(now) and _node_list(then):
            out.nodes.extend(_node_changes(now, then))
        else:
            out.keys.extend(f"{NAMESPACE}:{path}: {_show(a)} -> {_show(b)}" for path, a, b in _leaves(key, now, then))
    return out


def _node_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(n, dict) for n in v)


def _node_changes(now: list[dict], then: list[dict]) -> Iterator[str]:
    before = {_node_key(n): n for n in now}
    after = {_node_key(n): n for n in then}
    for key in dict.fromkeys([*before, *after]):
        a, b = before.get(key), after.get(key)
        if a is None:
            yield f"node {key}: back in the stack file, stage {b.get('stage')}"
        elif b is None:
            yield f"node {key}: leaves the stack file (stage {a.get('stage')} now; it was not listed then)"
        else:
            for path, x, y in _leaves("", a, b):
                yield f"node {key}: {path.lstrip('.')} {_show(x)} -> {_show(y)}"
    common = [k for k in before if k in after]
    if common != [k for k in after if k in before]:
        yield f"{NAMESPACE}:nodes: the order changes (it is the replacement order): {', '.join(after)}"


def _leaves(path: str, a: Any, b: Any) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in dict.fromkeys([*a, *b]):
            yield from _leaves(f"{path}.{k}", a.get(k, MISSING), b.get(k, MISSING))
    elif not same(a, b):
        yield path, a, b


def _show(v: Any, limit: int = 80) -> str:
    text = repr(v) if isinstance(v, _Marker) else v if isinstance(v, str) else json.dumps(v, default=str)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --- writing the stack file -------------------------------------------------------------------------------------

# Block layouts tried in turn (mapping indent, sequence indent, dash offset); the first that writes the unchanged file
# back byte for byte is the file's, so nothing but the restored keys changes form.
LAYOUTS = ((2, 4, 2), (2, 2, 0), (4, 4, 2), (4, 6, 4), (4, 4, 0), (2, 4, 0))


def restored_text(text: str, writes: dict[str, Any]) -> tuple[str, bool]:
    """The stack file `text` with `writes` applied to its `gpu-migration:*` keys: values changed in place (a node's
    stage is one scalar), comments, quoting, key order and every other key kept (ruamel.yaml round trip). Returns the
    text and whether the file's layout was reproduced exactly (else some untouched lines may change form)."""
    yaml, exact = _round_trip(text)
    doc = yaml.load(text)
    if doc is None:
        doc = CommentedMap()
    if not isinstance(doc, dict):
        raise HistoryError("the stack file is not a YAML mapping")
    if not isinstance(doc.get("config"), dict):
        doc["config"] = CommentedMap()
    config = doc["config"]
    for key, value in writes.items():
        full = f"{NAMESPACE}:{key}"
        if value is MISSING:
            config.pop(full, None)
        elif not isinstance(value, (dict, list)):
            config[full] = _top_scalar(config.get(full), value)
        else:
            config[full] = _merge(config[full], value) if full in config else value
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue(), exact


def _round_trip(text: str) -> tuple[YAML, bool]:
    first = None
    for mapping, sequence, offset in LAYOUTS:
        yaml = YAML()
        yaml.preserve_quotes = True
        yaml.width = 4096  # never re-wrap a long line
        yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
        out = io.StringIO()
        yaml.dump(yaml.load(text), out)
        if out.getvalue() == text:
            return yaml, True
        first = first or yaml
    return first, False


def _top_scalar(old: Any, text: Any) -> Any:
    """A top-level value as the CLI recorded it (a string), written so the CLI reads the same string back: a quoted
    string keeps its quotes, `2` and `true` are written plain unless the file had a string there, any other text is a
    string (YAML quotes it if it must: `1.30` plain would reach the program as 1.3)."""
    if not isinstance(text, str):
        return text
    if isinstance(old, ScalarString):
        return type(old)(text)
    if isinstance(old, str):
        return text
    if text in ("true", "false"):
        return text == "true"
    return int(text) if re.fullmatch(r"-?(0|[1-9][0-9]*)", text) else text


def _merge(old: Any, new: Any) -> Any:
    """`new` in place of `old`, keeping `old`'s containers (and so their comments) where both are maps or lists."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in [k for k in old if k not in new]:
            del old[k]
        for k, v in new.items():
            if k not in old or not same(old[k], v):
                old[k] = _merge(old[k], v) if k in old else v
        return old
    if isinstance(old, list) and isinstance(new, list):
        for i, v in enumerate(new[:len(old)]):
            if not same(old[i], v):
                old[i] = _merge(old[i], v)
        del old[len(new):]
        old.extend(new[len(old):])
        return old
    if isinstance(old, ScalarString) and isinstance(new, str):
        return type(old)(new)  # keeps its quoting
    return new
