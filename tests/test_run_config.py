"""Every conf group option and recipe composes onto the schema; bad keys fail clearly."""

from pathlib import Path

import pytest
from helpers import compose_config
from omegaconf import OmegaConf

from dspark.training.schema import check

CONF = Path(__file__).resolve().parents[1] / "conf"
RECIPES_DIR = CONF.parent / "recipes"
GROUPS = ["target", "draft", "data", "objective", "optim", "trainer", "tracking"]


def _options(group):
    """A group's options: its conf/ files, and for `objective` every registered objective."""
    from dspark.objectives import OBJECTIVES

    files = {p.stem for p in (CONF / group).glob("*.yaml")}
    return sorted(files | (set(OBJECTIVES) if group == "objective" else set()))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_group_option_validates(group, option):
    cfg = compose_config([f"{group}={option}", "data.train=x"])
    check(cfg)
    OmegaConf.to_container(cfg.draft, resolve=True, throw_on_missing=True)


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
def test_every_recipe_validates(recipe):
    cfg = compose_config([f"recipe={recipe}"])
    check(cfg)
    for group in GROUPS:
        OmegaConf.to_container(cfg[group], resolve=False, throw_on_missing=True)


def test_recipes_exist():
    assert {"debug", "quickstart", "qwen3_8b"} <= {p.stem for p in RECIPES_DIR.glob("*.yaml")}


def test_recipe_overrides_group_choice_and_values():
    cfg = compose_config(["recipe=debug"])
    assert cfg.target.name == "tiny-qwen3" and cfg.tracking.backend == "none"
    assert cfg.draft.num_hidden_layers == 1
    assert compose_config(["recipe=qwen3_8b", "data.train=x"]).optim.lr == 6e-4


def test_misspelt_key_is_an_error():
    with pytest.raises(Exception, match="lrr"):
        compose_config(["recipe=debug", "optim.lrr=1e-3"])


def test_wrong_type_is_an_error():
    with pytest.raises(Exception, match="block_size"):
        compose_config(["recipe=debug", "draft.block_size=seven"])


def test_bad_choice_names_allowed_values():
    cfg = compose_config(["recipe=debug", "draft.markov_head_type=lstm"])
    with pytest.raises(ValueError, match="vanilla"):
        check(cfg)


def _leaves(node, prefix=""):
    """(dotted key, value) of every non-mapping value in a yaml node, nested groups included."""
    for key, value in node.items():
        if OmegaConf.is_dict(value) or isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


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
    base = compose_config([*picks, "data.train=unset"])
    body = {k: v for k, v in node.items() if k != "defaults"}
    assert set(body) <= set(GROUPS), f"recipes/{recipe}.yaml sets keys outside {GROUPS}"
    for key, value in _leaves(body):  # every key, nested ones (draft.lora.r) included
        assert OmegaConf.select(base, key, throw_on_missing=False) != value, (
            f"recipes/{recipe}.yaml restates the default {key}={value}"
        )


def test_defaults_live_in_the_schema_only():
    # Group files may only differ from the schema; none restates a schema default.
    from dspark.training.schema import DistillConfig

    base = OmegaConf.structured(DistillConfig)
    for group in GROUPS:
        for path in (CONF / group).glob("*.yaml"):
            node = OmegaConf.load(path)
            for key, value in _leaves({k: v for k, v in node.items() if k != "defaults"}):
                assert OmegaConf.select(base, f"{group}.{key}", throw_on_missing=False) != value, (
                    f"{path} restates the schema default {group}.{key}={value}"
                )


def _restated_literals(path, scope, names):
    """Names among `names` whose default in `scope` (a class, or class.method) of the source
    file `path` is written as a literal rather than read from the one place it lives (None,
    "not set", is no restated default)."""
    import ast

    tree = ast.parse(Path(path).read_text())
    node = tree
    for name in scope.split("."):
        node = next(
            n
            for n in ast.walk(node)
            if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == name
        )
    if isinstance(node, ast.ClassDef):
        pairs = [
            (n.target.id, n.value)
            for n in node.body
            if isinstance(n, ast.AnnAssign) and n.value is not None
        ]
    else:
        a = node.args
        pairs = [(x.arg, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
    literal = [n for n, v in pairs if isinstance(v, ast.Constant) and v.value is not None]
    return [n for n in literal if n in names]


def test_draft_and_loss_defaults_have_one_source():
    """DSparkConfig holds the draft defaults, LOSS_WEIGHTS the loss weights, the head registry
    the head names; the schema, from_target_config and the objective read them, never restate
    them (a restated literal fails even while its value still agrees), so they cannot drift."""
    import dataclasses
    import inspect

    import dspark.config as config_module
    import dspark.objectives.dspark as objective_module
    import dspark.objectives.dspark_settings as settings_module
    import dspark.training.schema as schema_module
    from dspark.config import NUM_TARGET_FEATURES, DSparkConfig
    from dspark.modeling.heads import MARKOV_HEADS, markov_head_types
    from dspark.objectives import LOSS_WEIGHTS, DSparkObjective, DSparkSettings
    from dspark.training.schema import _CHOICES, DraftConfig

    model = {f.name: f.default for f in dataclasses.fields(DSparkConfig)}
    draft = {f.name: f.default for f in dataclasses.fields(DraftConfig)}
    # draft.vocab_size is the model's draft_vocab_size (the model's vocab_size is the target's)
    draft["draft_vocab_size"] = draft.pop("vocab_size")
    shared = set(model) & set(draft)
    assert {"num_hidden_layers", "block_size", "num_anchors", "markov_rank"} <= shared
    assert {k: draft[k] for k in shared} == {k: model[k] for k in shared}
    assert draft["num_target_layers_tapped"] == NUM_TARGET_FEATURES
    build = inspect.signature(DSparkConfig.from_target_config).parameters
    for name in shared:
        assert build[name].default == model[name], f"from_target_config's {name} default"
    assert build["num_target_features"].default == NUM_TARGET_FEATURES

    weights = dataclasses.asdict(LOSS_WEIGHTS)
    objective = {f.name: f.default for f in dataclasses.fields(DSparkSettings)}
    ctor = inspect.signature(DSparkObjective.__init__).parameters
    assert {k: objective[k] for k in weights} == weights
    assert {k: ctor[k].default for k in weights} == weights

    assert _CHOICES[("draft", "markov_head_type")] is markov_head_types
    assert markov_head_types() == tuple(MARKOV_HEADS)
    assert {"vanilla", "gated", "rnn"} <= set(MARKOV_HEADS)

    assert not _restated_literals(schema_module.__file__, "DraftConfig", model)
    assert not _restated_literals(settings_module.__file__, "DSparkSettings", weights)
    assert not _restated_literals(config_module.__file__, "DSparkConfig.from_target_config", model)
    assert not _restated_literals(objective_module.__file__, "DSparkObjective.__init__", weights)


def test_dflash_option_is_the_python_overrides():
    """`draft=dflash` and DFLASH_CONFIG_OVERRIDES are the same DFlash (see the constant's note)."""
    from dspark.objectives import DFLASH_CONFIG_OVERRIDES

    yaml = OmegaConf.to_container(OmegaConf.load(CONF / "draft" / "dflash.yaml"))
    assert yaml == DFLASH_CONFIG_OVERRIDES
    draft = compose_config(["draft=dflash", "data.train=x"]).draft
    assert {k: draft[k] for k in DFLASH_CONFIG_OVERRIDES} == DFLASH_CONFIG_OVERRIDES
