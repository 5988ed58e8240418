"""Flags over YAML (config.merge)."""

from edgeagent.config import merge


def test_another_model_on_the_command_line_drops_the_yamls_options() -> None:
    base = {
        "workers": 2,
        "train": {"model": "mobilenetv2", "model_options": {"width_mult": 0.5}, "epochs": 10},
    }
    assert merge(base, {"train": {"model": "mlp"}}) == {"workers": 2, "train": {"model": "mlp", "epochs": 10}}


def test_the_same_model_or_explicit_options_keep_what_was_given() -> None:
    base = {"train": {"model": "mobilenetv2", "model_options": {"width_mult": 0.5}}}
    assert merge(base, {"train": {"model": "mobilenetv2"}}) == base
    assert merge(base, {"train": {"epochs": 3}})["train"]["model_options"] == {"width_mult": 0.5}
    both = merge(base, {"train": {"model": "mlp", "model_options": {"hidden": [64]}}})
    assert both["train"] == {"model": "mlp", "model_options": {"hidden": [64]}}
