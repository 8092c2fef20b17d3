"""Suite-wide fixtures: offline hub, a private dspark cache, tiny random targets."""

import os

# Before anything imports huggingface_hub: a hub look-up otherwise hangs ~50 s offline.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The development machines' local copies of the named prompt sets, where a checkout has them
# beside it: the library itself only reads a folder it is given (tests that need none unset it).
_SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared")
for _env, _sub in (("DSPARK_BENCH_DIR", "bench"), ("DSPARK_PROMPTS_DIR", "prompts")):
    if os.path.isdir(os.path.join(_SHARED, "data", _sub)):
        os.environ.setdefault(_env, os.path.normpath(os.path.join(_SHARED, "data", _sub)))

import pytest  # noqa: E402
import torch  # noqa: E402

from dspark.target.tiny import TINY_ARCHS  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def dspark_cache(tmp_path_factory):
    """A fresh DSPARK_CACHE for the session so tests never read a user's cache."""
    path = tmp_path_factory.mktemp("dspark_cache")
    old = os.environ.get("DSPARK_CACHE")
    os.environ["DSPARK_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("DSPARK_CACHE", None)
    else:
        os.environ["DSPARK_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_target_dir(dspark_cache):
    """`tiny_target_dir(arch) -> Path` of a tiny random target built once per session."""
    from dspark.target import resolve_target

    def get(arch: str = "qwen3"):
        return resolve_target(f"tiny-{arch}")

    return get


@pytest.fixture(scope="session")
def tiny_target(tiny_target_dir):
    """`tiny_target(arch) -> (model, tokenizer)`, frozen, fp32, CPU; cached per arch."""
    from dspark.target import load_target

    cache = {}

    def get(arch: str = "qwen3"):
        if arch not in cache:
            tiny_target_dir(arch)
            cache[arch] = load_target(f"tiny-{arch}")
        return cache[arch]

    return get


@pytest.fixture(params=TINY_ARCHS)
def arch(request):
    return request.param


# Tiny models: one thread is faster than two (no fork-join overhead on small matmuls) and is
# immune to a busy neighbour on a 2-core machine.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module, restored after it (a test may have raised it): tiny
    models gain nothing from threads, and on a shared 2-core CPU they lose a lot."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def debug_data(tmp_path_factory, tiny_target_dir):
    """Embedded prompts answered by the tiny target itself, tokenized (the debug recipe's data,
    as `make debug-data` makes it, on 24 prompts)."""
    from helpers import make_debug_data

    return make_debug_data(tmp_path_factory.mktemp("debug_data"), limit=24)


@pytest.fixture(scope="session")
def tiny_sets(tmp_path_factory, tiny_target):
    """Feature caches of a small tokenized set: `get(arch) -> (target, tok, data_dir,
    {name: cache_dir})` with fp32 / bf16 / bf16-loss / q8_0 caches written once per arch (batch 3,
    small shards: several shards, mixed batches)."""
    from helpers import make_rows, save_rows

    from dspark.data.features import feature_cache as fc

    made = {}

    def get(arch):
        if arch not in made:
            target, tok = tiny_target(arch)
            root = tmp_path_factory.mktemp(f"fc_{arch}")
            data = save_rows(make_rows(target.config.vocab_size), root / "tokenized")
            ids = fc.resolve_layer_ids(target.config.num_hidden_layers)
            caches = {}
            for name, dtype, positions in (
                ("fp32", "fp32", "all"),
                ("bf16", "bf16", "all"),
                ("bf16_loss", "bf16", "loss"),
                ("q8_0", "q8_0", "all"),
            ):
                caches[name] = root / name
                fc.write_cache(
                    target,
                    data,
                    caches[name],
                    layer_ids=ids,
                    target_name=f"tiny-{arch}",
                    pad_token_id=tok.pad_token_id,
                    dtype=dtype,
                    positions=positions,
                    batch_size=3,
                    shard_mb=0.03,
                    progress=False,
                )
            made[arch] = (target, tok, data, caches)
        return made[arch]

    return get
