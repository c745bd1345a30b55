"""What the end-to-end test needs of tokenspeed, from a checkout (TOKENSPEED_SRC): its modules
importable on a CPU with Debian's torch 1.13 (the stubs under stubs/, this project's own), and
its real objects built as its event loop builds them: a CPU MHA cache pool whose arena is a
shared-memory object (so a sidecar can attach it by name), the KVArgs of get_kv_args, and the
KVManagerArgs topology. Nothing of tokenspeed is copied here: every call is into the checkout.
"""

import contextlib
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
# Modules tokenspeed imports that a CPU transfer never runs (GPU kernels, their platform probes,
# quantisation configs, its web front end's extras): lenient placeholders.
LENIENT = ["triton", "tokenspeed_kernel", "compressed_tensors", "pybase64", "xgrammar",
           "sentencepiece", "smg_grpc_proto", "torch_memory_saver", "flashinfer", "sgl_kernel",
           "uvloop", "orjson", "outlines", "partial_json_parser", "transformers", "msgspec",
           "psutil", "setproctitle", "tiktoken", "huggingface_hub", "safetensors",
           "prometheus_client", "viztracer", "instanttensor", "mooncake", "tqdm", "einops",
           "numba", "cuda", "pynvml", "nvtx", "tokenizers", "jinja2", "yaml", "interegular",
           "llguidance", "aiohttp", "fastapi", "uvicorn", "starlette", "pydantic", "openai",
           "requests", "PIL", "cv2", "decord", "soundfile", "librosa", "timm", "deep_gemm",
           "triton_kernels", "vllm", "cupy", "filelock"]


# Installed here but older than tokenspeed needs (Debian's pydantic is 1.x; tokenspeed's 2.x
# names, and fastapi over it): placeholders even when present.
TOO_OLD = ["pydantic", "fastapi"]


def missing() -> str:
    """Why the end-to-end test cannot run here ("" when it can): no checkout, or no torch."""
    source = os.environ.get("TOKENSPEED_SRC", "")
    if not source:
        return ("TOKENSPEED_SRC is not set: the end-to-end test drives tokenspeed's own "
                "executors from a checkout of lightseekorg/tokenspeed (docs/TOKENSPEED.md)")
    if not os.path.isfile(os.path.join(source, "python", "tokenspeed", "runtime", "pd",
                                       "prefill_executor.py")):
        return "TOKENSPEED_SRC=%s is not a tokenspeed checkout (no python/tokenspeed)" % source
    try:
        import torch  # noqa: F401
    except ImportError:
        return ("torch is not installed for %s (Debian: apt-get install python3-torch); "
                "tokenspeed's cache pools need it" % sys.executable)
    return ""


def load() -> None:
    """tokenspeed importable: the checkout on sys.path, the stubs before it, torch shimmed."""
    sys.path[:0] = [os.path.join(HERE, "stubs"),
                    os.path.join(os.environ["TOKENSPEED_SRC"], "python")]
    import lenient
    import torch_shims

    torch_shims.install()
    present = []
    for name in LENIENT:
        if name in TOO_OLD:
            continue
        try:
            __import__(name)
            present.append(name)
        except ImportError:
            pass
    lenient.install([name for name in LENIENT if name not in present])


@contextlib.contextmanager
def shared_memory_zeros(name: str):
    """While active, tokenspeed's CacheArena allocates its uint8 buffer as a shared mapping of
    /dev/shm/<name> (torch.zeros in its module), so that a sidecar can attach it by name."""
    import torch
    from tokenspeed.runtime.layers.attention.kv_cache import arena as arena_module

    real = torch.zeros

    def zeros(*size, dtype=None, device=None, **kwargs):
        if dtype is torch.uint8 and str(device) == "cpu":
            nbytes = int(size[0])
            path = "/dev/shm/" + name
            with open(path, "w+b") as f:
                f.truncate(nbytes)
            return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
        return real(*size, dtype=dtype, device=device, **kwargs)

    shim = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch)
                                    if not k.startswith("__")})
    shim.zeros = zeros
    arena_module.torch = shim
    try:
        yield
    finally:
        arena_module.torch = torch


def mha_pool(*, shm_name: str, layers: int, kv_heads: int, tp_size: int, head_dim: int,
             page_tokens: int, pages: int):
    """A real tokenspeed MHATokenToKVPool on the CPU, bf16, `kv_heads / tp_size` heads a rank,
    its arena in /dev/shm/<shm_name> (None: where tokenspeed puts it, private memory)."""
    import torch
    from tokenspeed.runtime.layers.attention.kv_cache.mha import MHATokenToKVPool

    shape = (page_tokens, kv_heads // tp_size, head_dim)
    arena = cache_arena(shm_name, layers, page_tokens, pages, (("k", shape), ("v", shape)))
    return MHATokenToKVPool(arena, torch.bfloat16, kv_heads // tp_size, head_dim, layers, 0)


def mla_pool(*, shm_name: str, layers: int, latent: int, rope: int, page_tokens: int,
             pages: int):
    """A real tokenspeed MLATokenToKVPool on the CPU, bf16: one latent field a layer
    (`latent + rope` wide), the same on every TP rank (CachePD replicates it)."""
    import torch
    from tokenspeed.runtime.layers.attention.kv_cache.mla import MLATokenToKVPool

    shape = (page_tokens, 1, latent + rope)
    arena = cache_arena(shm_name, layers, page_tokens, pages, (("latent_kv", shape),))
    return MLATokenToKVPool(arena, torch.bfloat16, torch.bfloat16, "", latent, rope, layers, 0)


def cache_arena(shm_name, layers, page_tokens, pages, fields):
    """A tokenspeed CacheArena of one full-attention group whose layers each have `fields`
    ((suffix, page shape) in bf16): the plan from tokenspeed's own spec.group, pack and bind."""
    import torch
    from tokenspeed.runtime.layers.attention.kv_cache.arena import CacheArena
    from tokenspeed.runtime.layers.attention.kv_cache.recipes import spec
    from tokenspeed.runtime.layers.attention.kv_cache.recipes.plan import (
        CacheFieldSpec, pack, scatter_stored_dtype_name)

    dtype = scatter_stored_dtype_name(torch.bfloat16)

    def fields_for_layer(layer_id, group_id, occurrence):
        return tuple(CacheFieldSpec("layer.%d.%s" % (layer_id, suffix),
                                    "unit.%d.%s" % (occurrence, suffix), shape, dtype)
                     for suffix, shape in fields)

    group_ids = ("full_attention",) * layers
    groups = spec.group(layer_types=(), group_ids=group_ids, sliding_window_tokens=None,
                        prefix_granularity=page_tokens, fields_for_layer=fields_for_layer,
                        pd_disaggregation_enabled=True)
    layout = pack(groups, prefix_granularity=page_tokens,
                  cache_blocks_per_lcm_block={"full_attention": 1}, alignment=1,
                  max_padding_fraction=1.0)
    plan = layout.bind(pages)
    specs = tuple(group_spec for group_spec, _ in groups)
    if shm_name is None:  # tokenspeed's own allocation: private memory
        return CacheArena(plan, "cpu", cache_group_specs=specs)
    with shared_memory_zeros(shm_name):
        return CacheArena(plan, "cpu", cache_group_specs=specs)


def model_config(*, layers: int, kv_heads: int, head_dim: int):
    """The model facts tokenspeed's transfer schema reads (ModelConfig's names)."""
    hf = types.SimpleNamespace(num_key_value_heads=kv_heads)
    return types.SimpleNamespace(num_attention_layers=layers, num_key_value_heads=kv_heads,
                                 head_dim=head_dim, hf_config=hf, hf_text_config=hf)


def kv_args(pool, config, rank: int):
    """tokenspeed's KVArgs for the pool, from its own get_kv_args (pd/factory.py)."""
    from tokenspeed.runtime.pd.factory import get_kv_args

    return get_kv_args(rank, rank, None, pool, model_config=config)


def manager_args(*, tp_size: int, tp_rank: int, dp_size: int = 1, dp_rank: int = 0,
                 bootstrap_port: int = 0):
    """tokenspeed's KVManagerArgs of a rank (its PDParallelTopology)."""
    from tokenspeed.runtime.pd.mooncake.entities import KVManagerArgs
    from tokenspeed.runtime.pd.topology import PDParallelTopology

    topology = PDParallelTopology(tp_size=tp_size, tp_rank=tp_rank, cp_size=1, cp_rank=0,
                                  dp_size=dp_size, dp_rank=dp_rank,
                                  world_size=tp_size * dp_size,
                                  global_rank=dp_rank * tp_size + tp_rank)
    return KVManagerArgs(bootstrap_port=bootstrap_port, dist_init_addr="127.0.0.1:0",
                         topology=topology, enable_metrics=False, served_model_name="test",
                         app_key="", metrics_reporters="", enable_dp_attention=dp_size > 1)
