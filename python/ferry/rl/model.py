"""Per-model declarations: the trainer's parameters and how each inference tensor is
made from them (fusion, TP / EP slices, fp8), for a trainer and an inference layout.

Two families cover the planner's models: ``qwen3_moe`` (GQA attention with q/k norms,
q,k,v fused into qkv_proj) and ``deepseek_v3`` (MLA: q_a_proj and kv_a_proj_with_mqa
fused, as SGLang's fused_qkv_a_proj_with_mqa; leading dense layers; a shared expert).
Routed experts are stacked on the trainer (w1, w3 [E, I, H], w2 [E, H, I], as
torchtitan keeps them) and fused on the inference side into w13 [E_local, 2I, H]
(gate then up, per expert) and w2 [E_local, H, I].
"""

from __future__ import annotations

from dataclasses import dataclass

from .meta import Part, Recipe, TrainerBlock, rows_cols
from .quant import scale_shape

BF16, FP32, FP8 = "bfloat16", "float32", "float8_e4m3fn"


@dataclass(frozen=True)
class ModelConfig:
    name: str
    family: str  # "qwen3_moe" | "deepseek_v3"
    layers: int
    hidden: int
    vocab: int
    heads: int
    experts: int
    top_k: int
    moe_inter: int
    kv_heads: int = 0
    head_dim: int = 0
    inter: int = 0  # dense MLP width (leading dense layers)
    first_dense: int = 0
    shared_experts: int = 0
    q_lora: int = 0
    kv_lora: int = 0
    nope: int = 0
    rope: int = 0
    v_head: int = 0


# Shapes from the public config.json of each model (numbers only).
KIMI_K2 = ModelConfig("Kimi-K2", "deepseek_v3", layers=61, hidden=7168, vocab=163840, heads=64,
                      experts=384, top_k=8, moe_inter=2048, inter=18432, first_dense=1,
                      shared_experts=1, q_lora=1536, kv_lora=512, nope=128, rope=64, v_head=128)
DEEPSEEK_V3 = ModelConfig("DeepSeek-V3", "deepseek_v3", layers=61, hidden=7168, vocab=129280,
                          heads=128, experts=256, top_k=8, moe_inter=2048, inter=18432,
                          first_dense=3, shared_experts=1, q_lora=1536, kv_lora=512, nope=128,
                          rope=64, v_head=128)
QWEN3_235B = ModelConfig("Qwen3-235B-A22B", "qwen3_moe", layers=94, hidden=4096, vocab=151936,
                         heads=64, kv_heads=4, head_dim=128, experts=128, top_k=8, moe_inter=1536)
# Small models of the same shapes' kinds, for tests (every width a multiple of 128).
TINY_QWEN3 = ModelConfig("tiny-qwen3-moe", "qwen3_moe", layers=2, hidden=256, vocab=512, heads=4,
                         kv_heads=2, head_dim=128, experts=4, top_k=2, moe_inter=128,
                         inter=384, first_dense=1)
TINY_DSV3 = ModelConfig("tiny-deepseek-v3", "deepseek_v3", layers=3, hidden=256, vocab=384,
                        heads=4, experts=8, top_k=2, moe_inter=128, inter=256, first_dense=1,
                        shared_experts=1, q_lora=128, kv_lora=128, nope=64, rope=64, v_head=64)
MODELS = {m.name: m for m in (KIMI_K2, DEEPSEEK_V3, QWEN3_235B, TINY_QWEN3, TINY_DSV3)}


def logical_params(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str, str, int]]:
    """name -> (shape, dtype, kind "dense"|"expert", layer; -1 embed, layers: head)."""
    H, out = cfg.hidden, {}
    out["embed_tokens.weight"] = ((cfg.vocab, H), BF16, "dense", -1)
    for li in range(cfg.layers):
        p = f"layers.{li}."

        def add(n, shape, kind="dense", dt=BF16):
            out[p + n] = (tuple(shape), dt, kind, li)

        add("input_layernorm.weight", (H,))
        add("post_attention_layernorm.weight", (H,))
        if cfg.family == "qwen3_moe":
            hd = cfg.head_dim
            add("self_attn.q_proj.weight", (cfg.heads * hd, H))
            add("self_attn.k_proj.weight", (cfg.kv_heads * hd, H))
            add("self_attn.v_proj.weight", (cfg.kv_heads * hd, H))
            add("self_attn.o_proj.weight", (H, cfg.heads * hd))
            add("self_attn.q_norm.weight", (hd,))
            add("self_attn.k_norm.weight", (hd,))
        else:
            qk = cfg.nope + cfg.rope
            add("self_attn.q_a_proj.weight", (cfg.q_lora, H))
            add("self_attn.q_a_layernorm.weight", (cfg.q_lora,))
            add("self_attn.q_b_proj.weight", (cfg.heads * qk, cfg.q_lora))
            add("self_attn.kv_a_proj_with_mqa.weight", (cfg.kv_lora + cfg.rope, H))
            add("self_attn.kv_a_layernorm.weight", (cfg.kv_lora,))
            add("self_attn.kv_b_proj.weight", (cfg.heads * (cfg.nope + cfg.v_head), cfg.kv_lora))
            add("self_attn.o_proj.weight", (H, cfg.heads * cfg.v_head))
        if li < cfg.first_dense:
            add("mlp.gate_proj.weight", (cfg.inter, H))
            add("mlp.up_proj.weight", (cfg.inter, H))
            add("mlp.down_proj.weight", (H, cfg.inter))
            continue
        E, mi = cfg.experts, cfg.moe_inter
        add("mlp.gate.weight", (E, H))
        if cfg.family == "deepseek_v3":
            add("mlp.gate.e_score_correction_bias", (E,), dt=FP32)
        add("mlp.experts.w1", (E, mi, H), "expert")
        add("mlp.experts.w3", (E, mi, H), "expert")
        add("mlp.experts.w2", (E, H, mi), "expert")
        if cfg.shared_experts:
            si = mi * cfg.shared_experts
            add("mlp.shared_experts.gate_proj.weight", (si, H))
            add("mlp.shared_experts.up_proj.weight", (si, H))
            add("mlp.shared_experts.down_proj.weight", (H, si))
    out["norm.weight"] = ((H,), BF16, "dense", cfg.layers)
    out["lm_head.weight"] = ((cfg.vocab, H), BF16, "dense", cfg.layers)
    return out


@dataclass(frozen=True)
class TrainerLayout:
    """world = pp * ep * fsdp; rank = stage*(ep*fsdp) + e*fsdp + f. Dense parameters of
    a stage are FSDP-sharded over all ep*fsdp ranks of the stage (MeshGroup "dense"),
    expert parameters over the fsdp ranks of each expert-parallel slice ("expert")."""

    pp: int = 1
    ep: int = 1
    fsdp: int = 1
    offloaded: bool = False

    @property
    def world(self) -> int:
        return self.pp * self.ep * self.fsdp


GROUP_ORDER = ("dense", "expert")


def stage_of(layer: int, layers: int, pp: int) -> int:
    if layer < 0:
        return 0
    if layer >= layers:
        return pp - 1
    return layer * pp // layers


def trainer_blocks(cfg: ModelConfig, lay: TrainerLayout) -> list[TrainerBlock]:
    """Every DTensor block of the trainer job, in a fixed order."""
    out = []
    per_stage = lay.ep * lay.fsdp
    for name, (shape, dt, kind, layer) in logical_params(cfg).items():
        s = stage_of(layer, cfg.layers, lay.pp)
        base = s * per_stage
        if kind == "dense":
            out.append(TrainerBlock(name, shape, dt, 0, "dense", tuple(range(base, base + per_stage)),
                                    offloaded=lay.offloaded))
            continue
        if shape[0] % lay.ep:
            raise ValueError(f"{name}: {shape[0]} experts do not split over ep={lay.ep}")
        el = shape[0] // lay.ep
        per = rows_cols(shape)[0] // shape[0]
        for e in range(lay.ep):
            mesh = tuple(range(base + e * lay.fsdp, base + (e + 1) * lay.fsdp))
            out.append(TrainerBlock(name, (el,) + shape[1:], dt, e * el * per, "expert", mesh,
                                    offloaded=lay.offloaded))
    return out


@dataclass(frozen=True)
class InferenceLayout:
    """instances x ep ranks; routed experts split over ep; everything dense is tensor
    parallel over tp consecutive ranks (one node) and replicated over the tp groups."""

    instances: int = 1
    ep: int = 1
    tp: int = 1

    @property
    def world(self) -> int:
        return self.instances * self.ep


def _q(name, parts, shape, fp8=True) -> Recipe:
    if not fp8:
        return Recipe(name, tuple(shape), BF16, tuple(parts))
    rows, cols = rows_cols(tuple(shape))
    srows = sum(scale_shape(p.rows, p.cols)[0] for p in parts)
    sshape = (srows, scale_shape(rows, cols)[1])
    if len(shape) == 3:  # stacked experts keep a per-expert scale layout
        sshape = (shape[0], srows // shape[0], sshape[1])
    return Recipe(name, tuple(shape), FP8, tuple(parts), scale_name(name), sshape)


def scale_name(name: str) -> str:
    """x.weight -> x.weight_scale_inv; experts.w13_weight -> experts.w13_weight_scale_inv."""
    return name + "_scale_inv"


def _whole(cfg_params, name) -> Part:
    shape = cfg_params[name][0]
    r, c = rows_cols(shape)
    return Part(name, 0, r, 0, c)


def _rows(name, r0, r1, cols) -> Part:
    return Part(name, r0, r1, 0, cols)


def inference_recipes(cfg: ModelConfig, lay: InferenceLayout, rank: int) -> list[Recipe]:
    """The tensors one inference rank holds and how each is made."""
    P = logical_params(cfg)
    H, tp = cfg.hidden, lay.tp
    local = rank % lay.ep
    t = local % tp
    out: list[Recipe] = []

    def copy(name):
        out.append(Recipe(name, P[name][0], P[name][1], (_whole(P, name),)))

    def row_slice(name, n_rows, dst=None, fp8=True):  # column-parallel: cut output rows
        cols = rows_cols(P[name][0])[1]
        k = n_rows // tp
        part = _rows(name, t * k, (t + 1) * k, cols)
        out.append(_q(dst or name, [part], (k, cols), fp8))

    def col_slice(name):  # row-parallel: cut input columns
        rows, cols = rows_cols(P[name][0])
        k = cols // tp
        out.append(_q(name, [Part(name, 0, rows, t * k, (t + 1) * k)], (rows, k)))

    def fused(dst, names_rows, cols):
        parts = []
        for n, total in names_rows:
            k = total // tp
            parts.append(_rows(n, t * k, (t + 1) * k, cols))
        out.append(_q(dst, parts, (sum(p.rows for p in parts), cols)))

    V = cfg.vocab
    row_slice("embed_tokens.weight", V, fp8=False)
    for li in range(cfg.layers):
        p = f"layers.{li}."
        copy(p + "input_layernorm.weight")
        copy(p + "post_attention_layernorm.weight")
        a = p + "self_attn."
        if cfg.family == "qwen3_moe":
            hd = cfg.head_dim
            kvh = cfg.kv_heads
            parts = [_rows(a + "q_proj.weight", t * cfg.heads // tp * hd, (t + 1) * cfg.heads // tp * hd, H)]
            kv = (t * kvh // tp) if kvh < tp else None  # fewer kv heads than ranks: replicate one
            for n in ("k_proj.weight", "v_proj.weight"):
                if kv is not None:
                    parts.append(_rows(a + n, kv * hd, (kv + 1) * hd, H))
                else:
                    parts.append(_rows(a + n, t * kvh // tp * hd, (t + 1) * kvh // tp * hd, H))
            out.append(_q(a + "qkv_proj.weight", parts, (sum(x.rows for x in parts), H)))
            col_slice(a + "o_proj.weight")
            copy(a + "q_norm.weight")
            copy(a + "k_norm.weight")
        else:
            qa, kva = a + "q_a_proj.weight", a + "kv_a_proj_with_mqa.weight"
            parts = [_whole(P, qa), _whole(P, kva)]
            out.append(_q(a + "fused_qkv_a_proj_with_mqa.weight", parts, (sum(x.rows for x in parts), H)))
            copy(a + "q_a_layernorm.weight")
            copy(a + "kv_a_layernorm.weight")
            row_slice(a + "q_b_proj.weight", P[a + "q_b_proj.weight"][0][0])
            row_slice(a + "kv_b_proj.weight", P[a + "kv_b_proj.weight"][0][0])
            col_slice(a + "o_proj.weight")
        m = p + "mlp."
        if li < cfg.first_dense:
            fused(m + "gate_up_proj.weight", [(m + "gate_proj.weight", cfg.inter), (m + "up_proj.weight", cfg.inter)], H)
            col_slice(m + "down_proj.weight")
            continue
        copy(m + "gate.weight")
        if cfg.family == "deepseek_v3":
            copy(m + "gate.e_score_correction_bias")
        E, mi = cfg.experts, cfg.moe_inter
        if E % lay.ep:
            raise ValueError(f"{E} experts do not split over inference ep={lay.ep}")
        el = E // lay.ep
        e0 = local * el
        w13 = []
        for e in range(e0, e0 + el):
            w13.append(_rows(m + "experts.w1", e * mi, (e + 1) * mi, H))
            w13.append(_rows(m + "experts.w3", e * mi, (e + 1) * mi, H))
        out.append(_q(m + "experts.w13_weight", w13, (el, 2 * mi, H)))
        out.append(_q(m + "experts.w2_weight", [_rows(m + "experts.w2", e0 * H, (e0 + el) * H, mi)], (el, H, mi)))
        if cfg.shared_experts:
            s = m + "shared_experts."
            si = mi * cfg.shared_experts
            fused(s + "gate_up_proj.weight", [(s + "gate_proj.weight", si), (s + "up_proj.weight", si)], H)
            col_slice(s + "down_proj.weight")
    copy("norm.weight")
    row_slice("lm_head.weight", V, fp8=False)
    for r in out:
        r.check()
    return out


def tensor_specs(recipes: list[Recipe]) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of every tensor an inference rank allocates: weights and scales."""
    out = []
    for r in recipes:
        out.append((r.name, r.shape, r.dtype))
        if r.quantised:
            out.append((r.scale, r.scale_shape, FP32))
    return out
