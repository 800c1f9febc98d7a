"""The base of every stack-config model (config/model.py, config/fleet.py): camelCase keys, unknown keys refused,
frozen, no inf/nan, and no boolean or unquoted number where it would be read as something else."""
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

from .grammar import _is_number_type

NAMESPACE = "gpu-migration"  # the program's config namespace, its Pulumi project name and its Kubernetes namespace


class Model(BaseModel):
    # allow_inf_nan=False: "inf" or "nan" is never a meaningful timeout, count or interval.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, v: Any, info: ValidationInfo) -> Any:
        # Pydantic's lax mode reads true as 1; for every number field (also ones added later) that hides a typo.
        if isinstance(v, bool) and _is_number_type(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"a boolean ({str(v).lower()}) where a number belongs")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and info.field_name.endswith("version"):
            raise ValueError(f"{v!r} is a number: YAML reads an unquoted version as one (25.10 as 25.1, 1.30 as 1.3); "
                             f"quote it as you mean it, e.g. \"25.10\"")
        return v
