"""What every family module shares: a typed view of config.json, an entry builder, the :class:`Family` record.

The family modules (:mod:`fitcheck.families.llama`, ...) mirror the ``__init__`` of each transformers 5.23 model
class parameter by parameter and declare the family's traits; this module holds what they share. Pure: no
torch, no file or env reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fitcheck.errors import ConfigError
from fitcheck.spec import Dtype, FamilyTraits, Kind, ModelShape, ParamEntry, Role

__all__ = ["ConfigView", "Family", "Inventory", "InventoryBuilder", "NotPureFamilyError", "TraitsFn", "mlp_kind"]

# A family's inventory: the parameter entries and the shape numbers (traits are attached by the registry).
Inventory = tuple[list[ParamEntry], ModelShape]
# A family's traits: from its config and the config-wide traits every family starts from.
TraitsFn = Callable[["ConfigView", FamilyTraits], FamilyTraits]


class NotPureFamilyError(Exception):
    """The config uses an option the pure inventory does not mirror (the caller falls back to meta)."""


class ConfigView:
    """Typed, read-only access to a config.json mapping with transformers' key aliases and defaults.

    Getters take several keys in priority order (e.g. GPT-2's ``n_embd`` before ``hidden_size``); a key whose
    value is ``null`` counts as absent, as transformers' config classes treat ``None`` as "use the default".

    Args:
        config: The parsed config.json.
    """

    def __init__(self, config: Mapping[str, object]) -> None:
        self._config = config
        self.model_type = str(config.get("model_type", ""))

    def present(self, key: str) -> bool:
        """True when config.json has the key at all (even with a null value)."""
        return key in self._config

    def get(self, key: str, default: object = None) -> object:
        """``config.get(key, default)``: a key present with ``null`` gives None, not the default."""
        return self._config.get(key, default)

    def raw(self, *keys: str) -> object:
        """The first present, non-null value among ``keys``, or None."""
        for key in keys:
            value = self._config.get(key)
            if value is not None:
                return value
        return None

    def _fail(self, key: str, expected: str, value: object) -> ConfigError:
        return ConfigError(
            f"config.json (model_type {self.model_type!r}): key {key!r} must be {expected}, got {value!r}"
        )

    def get_int(self, *keys: str, default: int | None = None) -> int:
        """An integer value; ``default`` when every key is absent.

        Raises:
            ConfigError: The value is not an integer, or it is absent and there is no default.
        """
        value = self.opt_int(*keys)
        if value is not None:
            return value
        if default is None:
            raise ConfigError(
                f"config.json (model_type {self.model_type!r}): required key {keys[0]!r} is missing; "
                "copy the model's full config.json from its Hub repo"
            )
        return default

    def opt_int(self, *keys: str) -> int | None:
        """An integer value or None when absent."""
        for key in keys:
            value = self._config.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self._fail(key, "an integer", value)
            if isinstance(value, float) and not value.is_integer():
                raise self._fail(key, "an integer", value)
            return int(value)
        return None

    def get_bool(self, *keys: str, default: bool) -> bool:
        """A boolean value (JSON true/false)."""
        for key in keys:
            value = self._config.get(key)
            if value is None:
                continue
            if not isinstance(value, bool):
                raise self._fail(key, "true or false", value)
            return value
        return default

    def get_float(self, *keys: str, default: float) -> float:
        """A float value."""
        for key in keys:
            value = self._config.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self._fail(key, "a number", value)
            return float(value)
        return default

    def get_str(self, *keys: str, default: str) -> str:
        """A string value."""
        for key in keys:
            value = self._config.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise self._fail(key, "a string", value)
            return value
        return default

    def mapping(self, key: str) -> Mapping[str, object]:
        """A nested object (e.g. ``rope_parameters``); empty when absent or not an object."""
        value = self._config.get(key)
        return value if isinstance(value, Mapping) else {}

    def config_dtype(self) -> Dtype | None:
        """``dtype`` (transformers 5) or ``torch_dtype`` (4.x): the dtype ``dtype="auto"`` loads.

        transformers 5 keeps ``dtype`` when both are present (configuration_utils.py, PreTrainedConfig).
        """
        value = self.raw("dtype", "torch_dtype")
        return Dtype.from_name(value) if isinstance(value, str) else None

    def partial_rotary_factor(self, default: float) -> float:
        """``partial_rotary_factor`` at top level, else inside ``rope_parameters``/``rope_scaling``."""
        if self.raw("partial_rotary_factor") is not None:
            return self.get_float("partial_rotary_factor", default=default)
        for key in ("rope_parameters", "rope_scaling"):
            nested = self.mapping(key).get("partial_rotary_factor")
            if isinstance(nested, (int, float)) and not isinstance(nested, bool):
                return float(nested)
        return default


def mlp_kind(activation: str, *, gated: bool) -> str:
    """``ModelShape.mlp_activation``: ``"swiglu"`` for any gated (GLU) MLP, else ``"gelu"``/``"relu"``.

    The contract (fitcheck/spec.py ModelShape) names every gated three-matrix MLP ``"swiglu"``; Gemma's gate
    uses GELU-tanh but saves the same tensors.
    """
    if gated:
        return "swiglu"
    act = activation.lower()
    if "gelu" in act:
        return "gelu"
    if "relu" in act:
        return "relu"
    return act


class InventoryBuilder:
    """Collects :class:`ParamEntry` rows in the order transformers registers the parameters."""

    def __init__(self) -> None:
        self.params: list[ParamEntry] = []

    def add(
        self,
        name: str,
        shape: tuple[int, ...],
        role: Role,
        kind: Kind,
        *,
        repeat: int = 1,
        in_features: int = 0,
        out_features: int = 0,
    ) -> None:
        """Add one parameter; its module short name is the segment before the parameter name."""
        self.params.append(
            ParamEntry(
                name=name,
                shape=shape,
                role=role,
                kind=kind,
                repeat=repeat,
                module=name.split(".")[-2] if "." in name else "",
                in_features=in_features,
                out_features=out_features,
            )
        )

    def linear(self, prefix: str, in_f: int, out_f: int, role: Role, *, bias: bool, repeat: int = 1) -> None:
        """``nn.Linear(in_f, out_f, bias)``: weight ``(out, in)`` and optional bias ``(out,)``."""
        self.add(
            f"{prefix}.weight",
            (out_f, in_f),
            role,
            Kind.LINEAR,
            repeat=repeat,
            in_features=in_f,
            out_features=out_f,
        )
        if bias:
            self.add(f"{prefix}.bias", (out_f,), Role.BIAS, Kind.BIAS, repeat=repeat)

    def conv1d(self, prefix: str, in_f: int, out_f: int, role: Role, *, repeat: int = 1) -> None:
        """transformers ``Conv1D(nf=out_f, nx=in_f)`` (GPT-2): weight stored ``(in, out)``, always a bias."""
        self.add(
            f"{prefix}.weight",
            (in_f, out_f),
            role,
            Kind.LINEAR,
            repeat=repeat,
            in_features=in_f,
            out_features=out_f,
        )
        self.add(f"{prefix}.bias", (out_f,), Role.BIAS, Kind.BIAS, repeat=repeat)

    def norm(self, prefix: str, dim: int, *, bias: bool, repeat: int = 1) -> None:
        """LayerNorm (weight + bias) or RMSNorm (weight only)."""
        self.add(f"{prefix}.weight", (dim,), Role.NORM, Kind.NORM, repeat=repeat)
        if bias:
            self.add(f"{prefix}.bias", (dim,), Role.NORM, Kind.NORM, repeat=repeat)

    def embedding(self, prefix: str, num: int, dim: int, role: Role = Role.EMBEDDING) -> None:
        """``nn.Embedding(num, dim)`` (or a subclass such as Gemma's scaled embedding)."""
        self.add(f"{prefix}.weight", (num, dim), role, Kind.EMBEDDING)

    def lm_head(self, vocab: int, hidden: int, *, tied: bool, bias: bool = False) -> None:
        """``lm_head = nn.Linear(hidden, vocab)``; a tied weight is the input embedding and is not repeated.

        A bias (Phi) is never tied: transformers ties only the weight.
        """
        if not tied:
            self.add(
                "lm_head.weight",
                (vocab, hidden),
                Role.LM_HEAD,
                Kind.LINEAR,
                in_features=hidden,
                out_features=vocab,
            )
        if bias:
            self.add("lm_head.bias", (vocab,), Role.BIAS, Kind.BIAS)


@dataclass(frozen=True)
class Family:
    """One ``model_type``: its traits and, when mirrored in pure Python, its parameter inventory.

    Attributes:
        model_type: config.json ``model_type``.
        traits: Builds the family's :class:`FamilyTraits` from its config.
        inventory: The pure-Python inventory, or None (counted on the meta device).
    """

    model_type: str
    traits: TraitsFn
    inventory: Callable[[ConfigView], Inventory] | None = None
