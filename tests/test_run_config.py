"""Every conf group option and recipe composes onto the schema; bad keys fail clearly."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from dspark.training.schema import check, register_configs

CONF = Path(__file__).resolve().parents[1] / "conf"
RECIPES_DIR = CONF.parent / "recipes"
GROUPS = ["target", "draft", "data", "objective", "optim", "trainer", "tracking"]


def _compose(overrides):
    GlobalHydra.instance().clear()
    register_configs(RECIPES_DIR)
    with initialize_config_dir(str(CONF), version_base=None):
        return compose("config", overrides=overrides, return_hydra_config=True)


def _options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_group_option_validates(group, option):
    cfg = _compose([f"{group}={option}", "data.train=x"])
    check(cfg)
    OmegaConf.to_container(cfg.draft, resolve=True, throw_on_missing=True)


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
def test_every_recipe_validates(recipe):
    cfg = _compose([f"recipe={recipe}"])
    check(cfg)
    for group in GROUPS:
        OmegaConf.to_container(cfg[group], resolve=False, throw_on_missing=True)


def test_recipes_exist():
    assert {"debug", "quickstart", "qwen3_8b"} <= {p.stem for p in RECIPES_DIR.glob("*.yaml")}


def test_recipe_overrides_group_choice_and_values():
    cfg = _compose(["recipe=debug"])
    assert cfg.target.name == "tiny-qwen3" and cfg.tracking.backend == "none"
    assert cfg.draft.num_hidden_layers == 1
    assert _compose(["recipe=qwen3_8b", "data.train=x"]).optim.lr == 6e-4


def test_misspelt_key_is_an_error():
    with pytest.raises(Exception, match="lrr"):
        _compose(["recipe=debug", "optim.lrr=1e-3"])


def test_wrong_type_is_an_error():
    with pytest.raises(Exception, match="block_size"):
        _compose(["recipe=debug", "draft.block_size=seven"])


def test_bad_choice_names_allowed_values():
    cfg = _compose(["recipe=debug", "draft.markov_head_type=lstm"])
    with pytest.raises(ValueError, match="vanilla"):
        check(cfg)


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
def test_recipes_restate_no_default(recipe):
    """A recipe only says how it differs from the schema plus the group options it picks."""
    node = OmegaConf.load(RECIPES_DIR / f"{recipe}.yaml")
    picks = []
    for entry in node.get("defaults", []):
        if isinstance(entry, str):  # another recipe it builds on: compare against that one
            picks.append(f"recipe={entry}")
            continue
        ((key, value),) = entry.items()
        picks.append(f"{key.removeprefix('override ').removeprefix('/')}={value}")
    base = _compose([*picks, "data.train=unset"])
    for group in GROUPS:
        for key, value in (node.get(group) or {}).items():
            assert base[group][key] != value, (
                f"recipes/{recipe}.yaml restates the default {group}.{key}={value}"
            )


def test_defaults_live_in_the_schema_only():
    # Group files may only differ from the schema; none restates a schema default.
    from dspark.training.schema import DistillConfig

    base = OmegaConf.structured(DistillConfig)
    for group in GROUPS:
        for path in (CONF / group).glob("*.yaml"):
            node = OmegaConf.load(path)
            for key, value in node.items():
                if key == "defaults":
                    continue
                assert OmegaConf.select(base, f"{group}.{key}", throw_on_missing=False) != value, (
                    f"{path} restates the schema default {group}.{key}={value}"
                )
