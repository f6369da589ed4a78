"""Static schedule properties over random and real layouts: every destination byte
written exactly once, owners inside their sub-mesh, bytes balanced over trainer NICs,
MeshGroups in order, ring placement under the watermark, deterministic."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest

from ferry.rl import model as M
from ferry.rl import schedule as S
from ferry.rl.meta import InferenceMeta, TrainerMeta


def metas(cfg, tl, il, nics=1):
    blocks = M.trainer_blocks(cfg, tl)
    tm = [TrainerMeta(r, nics, tuple(b for b in blocks if r in b.mesh)) for r in range(tl.world)]
    im = [InferenceMeta(r, tuple(M.inference_recipes(cfg, il, r))) for r in range(il.world)]
    return tm, im


def assert_properties(s: S.Schedule, tm, im, tl):
    S.check(s, im)
    # MeshGroups in order for every rank, each job in exactly one sequence
    seen = []
    for r in range(tl.world):
        seq = s.rank_sequence(r)
        assert [g for g, _ in seq] == s.groups
        for g, ids in seq:
            assert all(s.jobs[i].group == g and r in s.jobs[i].mesh for i in ids)
    for key, ids in s.order.items():
        seen.extend(ids)
    assert sorted(seen) == list(range(len(s.jobs)))
    # balance: longest-job-first keeps each rank within one job of the mesh's mean
    for (g, mesh), ids in s.order.items():
        load = {r: 0 for r in mesh}
        for i in ids:
            load[s.jobs[i].owner] += s.jobs[i].sent_bytes
        mean = sum(load.values()) / len(mesh)
        biggest = max(s.jobs[i].sent_bytes for i in ids)
        assert max(load.values()) <= mean + biggest
    # ring: a job never reuses memory of an earlier job of its owner it does not wait for
    for r in range(tl.world):
        mine = [s.jobs[i] for _, ids in s.rank_sequence(r) for i in ids if s.jobs[i].owner == r]
        done: set[int] = set()
        for k, j in enumerate(mine):
            for w in j.wait_for:
                done.add(w)
            for a in mine[:k]:
                if a.id in done:
                    continue
                overl = a.pool_offset < j.pool_offset + j.footprint and j.pool_offset < a.pool_offset + a.footprint
                assert not overl, f"job {j.id} overlaps unfinished job {a.id}"
            # waiting for a job means every job placed before it finished as well
            if j.wait_for:
                done.update(x.id for x in mine[: max(mine.index(s.jobs[w]) for w in j.wait_for) + 1])


def random_case(seed: int):
    rnd = random.Random(seed)
    experts = rnd.choice([4, 8, 16])
    kvh = rnd.choice([1, 2, 4])
    heads = kvh * rnd.choice([1, 2])
    fam = rnd.choice(["qwen3_moe", "deepseek_v3"])
    cfg = M.ModelConfig(f"rand{seed}", fam, layers=rnd.randint(1, 4), hidden=128 * rnd.randint(1, 3),
                        vocab=128 * rnd.randint(1, 4), heads=heads, kv_heads=kvh, head_dim=128,
                        experts=experts, top_k=2, moe_inter=128 * rnd.randint(1, 2),
                        inter=256, first_dense=rnd.randint(0, 1), shared_experts=rnd.randint(0, 1),
                        q_lora=128, kv_lora=128, nope=64, rope=64, v_head=64)
    tl = M.TrainerLayout(pp=rnd.choice([1, 2]), ep=rnd.choice([d for d in (1, 2, 4) if experts % d == 0]),
                         fsdp=rnd.choice([1, 2, 3]))
    tp = rnd.choice([d for d in (1, 2) if heads % d == 0])
    iep = rnd.choice([d for d in (1, 2, 4, 8) if experts % d == 0 and d % tp == 0])
    il = M.InferenceLayout(instances=rnd.randint(1, 3), ep=iep, tp=tp)
    return cfg, tl, il, rnd.choice([1, 2])


@pytest.mark.parametrize("seed", range(40))
def test_random_layouts(seed):
    cfg, tl, il, nics = random_case(seed)
    if cfg.layers < tl.pp:
        tl = replace(tl, pp=1)
    tm, im = metas(cfg, tl, il, nics)
    s = S.build(tm, im, watermark=4 << 20)
    assert_properties(s, tm, im, tl)
    # deterministic, also when the metadata arrives in another order
    rnd = random.Random(seed)
    tm2, im2 = tm[:], im[:]
    rnd.shuffle(tm2)
    rnd.shuffle(im2)
    assert S.build(tm2, im2, watermark=4 << 20).digest() == s.digest()


def test_watermark_smaller_than_a_job_is_refused():
    tm, im = metas(M.TINY_QWEN3, M.TrainerLayout(ep=2), M.InferenceLayout(ep=2, tp=2))
    with pytest.raises(ValueError, match="watermark"):
        S.build(tm, im, watermark=64 << 10)


def test_kimi_k2_256_to_128():
    """The planner's real layout: FSDP/PP/EP 16/2/8 -> 4 instances of EP32 (dense TP8)."""
    t0 = time.monotonic()
    tl, il = M.TrainerLayout(pp=2, ep=8, fsdp=16), M.InferenceLayout(instances=4, ep=32, tp=8)
    tm, im = metas(M.KIMI_K2, tl, il)
    s = S.build(tm, im, watermark=4 << 30)
    S.check(s, im)
    sent = [s.sent_bytes(r) for r in range(tl.world)]
    assert max(sent) <= 1.05 * sum(sent) / len(sent)  # within 5% of perfect balance
    recv = [s.received_bytes(r) for r in range(il.world)]
    assert max(recv) == min(recv)  # every inference rank holds the same bytes
    assert s.groups == ["dense", "expert"]
    assert time.monotonic() - t0 < 120
