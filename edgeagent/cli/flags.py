"""The training commands' options, in groups, each one a configuration key with its default shown.

Note: one declaration per option, from which everything else follows.
    Each flag names the YAML key it overrides (``--learning-rate`` is ``train.learning_rate``); its
    default is read from the typed model (:mod:`edgeagent.config`), so the help cannot drift from it;
    it reads ``EDGEAGENT_<KEY>`` from the environment (``EDGEAGENT_LEARNING_RATE``), so the order is
    flag > environment > YAML file > default: a flag or variable that is set is an override of the
    YAML, one that is not is None and leaves the YAML's value. Options that only some modes read sit in
    a group of their own whose title says so (:func:`edgeagent.mode_names.mode_keys`; the
    configuration refuses them under another mode). Old spellings (``--lr``, ``--id``) still work as
    deprecated aliases that warn once (:class:`Command`).

    cloup carries the groups: it is click's own option-group extension (the commands stay click
    commands, the group sits next to its options in the code, help stays plain text), where rich-click
    keeps groups in a separate table keyed by command name and draws boxes around them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click
import cloup
from pydantic import BaseModel

from edgeagent.config import CentralConfig
from edgeagent.ops import shipped

F = TypeVar("F", bound=Callable[..., Any])

ENV_PREFIX = "EDGEAGENT_"
ALIAS_PREFIX = "alias__"


def envvar(key: str) -> str:
    """The environment variable of configuration key ``key``: ``EDGEAGENT_LEARNING_RATE``."""
    return ENV_PREFIX + key.upper()


@dataclass(frozen=True)
class Flag:
    """One option: its flag(s), the configuration key it sets (also its parameter name) and its help."""

    decls: tuple[str, ...]
    key: str
    help: str
    model: type[BaseModel] | None = CentralConfig  # where the key's default is read; None: no key
    default: str | None = None  # shown default when the model's is not what this command uses
    aliases: tuple[str, ...] = ()  # deprecated spellings
    kwargs: dict[str, Any] = field(default_factory=dict)

    def shown_default(self) -> str | None:
        if self.default is not None:
            return self.default
        if self.model is None or self.key not in self.model.model_fields:
            return None
        info = self.model.model_fields[self.key]
        value = info.get_default(call_default_factory=True)
        if isinstance(value, bool):
            return "on" if value else "off"
        if value is None:
            return "none"
        if isinstance(value, list | dict) and not value:
            return "none"
        return str(value)

    def options(self) -> list[Callable[[F], F]]:
        kwargs = dict(self.kwargs)
        kwargs.setdefault("default", None)
        shown = self.shown_default()
        text = self.help
        if shown is not None and not kwargs.get("hidden"):
            # In the help text rather than click's show_default, which puts a text default in brackets.
            text = f"{text}  [default: {shown}]"
        if self.model is not None:
            kwargs.setdefault("envvar", envvar(self.key))
        made = [cloup.option(*self.decls, self.key, help=text, **kwargs)]
        for alias in self.aliases:
            alias_kwargs = {k: v for k, v in kwargs.items() if k in ("type", "multiple", "is_flag")}
            made.append(
                cloup.option(alias, ALIAS_PREFIX + self.key, hidden=True, default=None, **alias_kwargs)
            )
        return made


@dataclass(frozen=True)
class Group:
    title: str
    flags: tuple[Flag, ...]
    help: str | None = None


def apply(groups: Iterable[Group]) -> Callable[[F], F]:
    """A decorator adding ``groups`` to a command, in order (hidden aliases after their group)."""

    def decorate(f: F) -> F:
        for group in reversed(list(groups)):
            shown: list[Any] = []
            hidden: list[Any] = []
            for flag in group.flags:
                first, *aliases = flag.options()
                shown.append(first)
                hidden.extend(aliases)
            for alias in hidden:
                f = alias(f)
            f = cloup.option_group(group.title, *shown, help=group.help)(f)
        return f

    return decorate


_warned: set[str] = set()


def warn_deprecated(old: str, new: str) -> None:
    """Say once per process that ``old`` is now ``new``."""
    if old in _warned:
        return
    _warned.add(old)
    click.echo(f"warning: {old} is deprecated; use {new} (the old name still works for now)", err=True)


class Command(cloup.Command):
    """A command whose deprecated aliases (hidden ``alias__<key>`` options) fill their key and warn once;
    the new name wins when both are given."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        for name in [n for n in ctx.params if n.startswith(ALIAS_PREFIX)]:
            value = ctx.params.pop(name)
            if value is None or value == ():
                continue
            key = name.removeprefix(ALIAS_PREFIX)
            params = {p.name: p for p in self.params}
            old = params[name].opts[0]
            warn_deprecated(old, params[key].opts[0])
            source = ctx.get_parameter_source(key)
            if ctx.params.get(key) in (None, ()) or source == click.core.ParameterSource.DEFAULT:
                ctx.params[key] = value
        return rest


SETTINGS: dict[str, Any] = {
    "cls": Command,
    "show_constraints": False,
    "align_option_groups": False,
    "formatter_settings": cloup.HelpFormatter.settings(max_width=100, col1_max_width=34, col2_min_width=40),
}

ENV_EPILOG = (
    "Every option reads EDGEAGENT_<KEY> from the environment too (EDGEAGENT_EPOCHS=3, "
    "EDGEAGENT_LEARNING_RATE=0.1): a flag wins over the variable, the variable over the YAML file, "
    "the file over the default. --print-config shows the result."
)


def _shipped_config(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return None if value is None else str(shipped.config_file(value))


CONFIG = Flag(
    ("--config",),
    "config_file",
    f"YAML file; a name not found here (central.yaml, "
    f"configs/worker.yaml) is taken from the shipped examples in {shipped.CONFIGS}.",
    None,
    kwargs={"type": click.Path(dir_okay=False), "callback": _shipped_config, "envvar": envvar("config")},
)


def choice(*values: str) -> click.Choice:
    return click.Choice(values)


__all__ = ["CONFIG", "ENV_EPILOG", "SETTINGS", "Command", "Flag", "Group", "apply", "choice", "envvar"]
