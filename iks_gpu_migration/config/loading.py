"""Reading the stack's `gpu-migration:*` keys and validating them: every problem reported at once, naming key and value."""
import difflib
import json
from typing import Any, Optional, get_args

import pulumi
from pydantic import ValidationError

from .cross_checks import CROSS_CHECKS, Loc, Problem
from .model import NAMESPACE, STAGES, ConfigError, MigrationConfig, Model, Node

SECRET_KEYS = ("ibmApiKey",)  # read on their own (components/migration.py ibm_api), never in the model


def _loc_text(loc: Loc) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")


def _problems(error: ValidationError) -> list[Problem]:
    out = []
    for e in error.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] in ("literal_error",):
            msg = f"{e['input']!r} is not one of {', '.join(STAGES)}"
        elif e["type"] == "extra_forbidden":
            msg = f"unknown key (got {e['input']!r})" + _did_you_mean(tuple(e["loc"]))
        elif e["type"] == "missing":
            msg = "is required"
        elif "input" in e and not isinstance(e["input"], (dict, list)) and repr(e["input"]) not in msg:
            msg = f"{msg} (got {e['input']!r})"
        out.append(Problem(tuple(e["loc"]), msg))
    return out


def _did_you_mean(loc: Loc) -> str:
    """'; did you mean X?' for an unknown key close to a known one at the same place (difflib), else ''."""
    model: Any = MigrationConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # an entry of a list: its model is the list's (below)
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return ""
        model = _model_of(field.annotation)
        if model is None:
            return ""
    known = [f.alias or n for n, f in model.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.7)
    return f"; did you mean {close[0]}?" if close else ""


def _model_of(annotation: Any) -> Optional[type]:
    """The pydantic model of a field (also inside Optional[...] or list[...]), or None."""
    if isinstance(annotation, type) and issubclass(annotation, Model):
        return annotation
    for arg in get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _format(problems: list[Problem]) -> str:
    lines = [f"  {NAMESPACE}:{_loc_text(p.loc)}: {p.message}" if p.loc else f"  {NAMESPACE}: {p.message}"
             for p in problems]
    return "invalid stack config:\n" + "\n".join(dict.fromkeys(lines))


def _partial(raw: dict[str, Any], failed: list[Problem]) -> tuple[MigrationConfig, set[str]]:
    """A model holding only the fields of `raw` that are valid on their own (typed as in a full parse), and their
    names. Invalid node entries become None so that indexes stay those of the config."""
    bad = {p.loc[0] for p in failed if p.loc}
    partial = MigrationConfig.model_construct()  # defaults for every optional field
    present: set[str] = set()
    for name, field in MigrationConfig.model_fields.items():
        alias = field.alias or name
        if alias not in raw:
            if not field.is_required():
                present.add(name)
        elif alias not in bad:
            try:  # runs the field's own validators, one field at a time
                MigrationConfig.__pydantic_validator__.validate_assignment(partial, name, raw[alias])
                present.add(name)
            except Exception:  # noqa: BLE001 - already reported by the full parse; the field is just left out
                pass
        elif name == "nodes" and isinstance(raw[alias], list):
            object.__setattr__(partial, name, [_valid_or_none(Node, entry) for entry in raw[alias]])
            present.add(name)
    return partial, present


def _valid_or_none(model: type[Model], value: Any) -> Optional[Model]:
    try:
        return model.model_validate(value)
    except ValidationError:
        return None


def parse(raw: dict[str, Any], problems: Optional[list[Problem]] = None) -> MigrationConfig:
    """Validate a dict of camelCase config values; raise ConfigError listing every problem (`problems`: ones found
    before, e.g. plain_secrets)."""
    problems = list(problems or [])
    try:
        cfg = MigrationConfig.model_validate(raw)
        present = set(MigrationConfig.model_fields)
    except ValidationError as e:
        failed = _problems(e)
        problems.extend(failed)
        cfg, present = _partial(raw, failed)
    for fields, check in CROSS_CHECKS:
        if set(fields) <= present:
            problems.extend(check(cfg))
    if problems:
        raise ConfigError(_format(problems))
    return cfg


def raw_from_pulumi() -> dict[str, Any]:
    """Every `gpu-migration:*` key of the current stack, JSON values decoded (unknown keys are kept so they fail)."""
    raw: dict[str, Any] = {}
    for env_key, value in _stack_config().items():
        namespace, _, key = env_key.partition(":")
        if namespace != NAMESPACE or key in SECRET_KEYS:  # secrets are read on their own
            continue
        raw[key] = _decode(value)
    return raw


def _stack_config() -> dict[str, Any]:
    # The language host passes config via set_all_config (CONFIG); older hosts via PULUMI_CONFIG.
    return {**pulumi.runtime.get_config_env(), **pulumi.runtime.config.CONFIG.get()}


def plain_secrets() -> list[Problem]:
    """Secret keys set without --secret: the stack file holds them readable. The engine tells the program which keys
    are secrets (the language host's configSecretKeys -> pulumi.runtime.set_all_config; is_config_secret reads them,
    pulumi 3.272 sdk/python/lib/pulumi/runtime/config.py)."""
    config = _stack_config()
    return [Problem((key,), f"is set in plain text, so Pulumi.<stack>.yaml holds it readable: set it as a secret "
                            f"(`pulumi config set --secret {NAMESPACE}:{key} <value>`), and rotate the key if the "
                            f"file was shared or committed")
            for key in SECRET_KEYS
            if config.get(f"{NAMESPACE}:{key}") is not None
            and not pulumi.runtime.is_config_secret(f"{NAMESPACE}:{key}")]


def _decode(value: Any) -> Any:
    """Objects and lists arrive JSON-encoded; scalars stay strings (so kubeVersion 1.37 is not a float)."""
    try:
        decoded = json.loads(value)
    except (TypeError, json.JSONDecodeError):
        return value
    return decoded if isinstance(decoded, (dict, list)) else value


def load() -> MigrationConfig:
    return parse(raw_from_pulumi(), plain_secrets())
