"""ferry.moe sizing without a GPU: the buffer arithmetic the C++ routing tests
check in detail, seen from Python (runs in CI)."""

from __future__ import annotations

import pytest

import ferry
from ferry import moe


def test_buffer_size_hint_decode_shape():
    s = moe.buffer_size_hint(max_num_tokens=128, num_experts=256, experts_per_token=8, hidden=7168,
                             hidden_scale=56, in_dtype="float8_e4m3fn", out_dtype="bfloat16",
                             expert_padding=16, world_size=4, max_private_tokens=40)
    assert s["dispatch_stride"] == 7168 + 224
    assert s["combine_stride"] == 7168 * 2
    assert s["recv_rows"] == 4 * 40 + 4 * 128 * 8
    # sum_l round_up(count_l, 16) over 64 local experts, at most 4096 + 64 * 15 rows.
    assert s["out_rows"] == (4 * 128 * 8 + 64 * 15) // 16 * 16
    assert s["max_private_tokens"] == 40


def test_default_private_round_and_validation():
    s = moe.buffer_size_hint(max_num_tokens=128, num_experts=64, experts_per_token=4, hidden=128,
                             world_size=8)
    assert s["max_private_tokens"] == (128 * 4 // 8 * 6 + 4) // 5  # 1.2x an even share
    with pytest.raises(ferry.FerryError) as e:
        moe.buffer_size_hint(max_num_tokens=128, num_experts=60, experts_per_token=4, hidden=128,
                             world_size=8)
    assert e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(TypeError):
        moe.buffer_size_hint(max_num_tokens=1, num_experts=8, experts_per_token=1, hidden=8,
                             world_size=1, in_dtype="int8")
