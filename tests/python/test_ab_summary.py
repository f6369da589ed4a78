"""scripts/ab_summary.py, which the A/B figures of docs/OBSERVABILITY.md come from: it
must read ferry-bench's rows and pair each variant with the base of the same round."""

import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "ab_summary.py"


@pytest.fixture(scope="module")
def ab():
    spec = importlib.util.spec_from_file_location("ab_summary", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ROW_PAGED = ("paged        4K   100   y  32 |  {gbps:.3f}   9.99     3233   323276  9188.8 17463.2 "
             "275.58 |                                      - |   nan  \n")
ROW_IMM = ("imm           0     1   y   1 |  0.000   0.00    79096    79096     {p50:.1f}    17.5  "
           "12.61 |                                      - |   nan  \n")


def _write(tmp_path, rounds):
    """rounds: [(round, variant, GB/s, imm p50)]"""
    text = "load average at start: 0.1\n"
    for r, v, gbps, p50 in rounds:
        text += f"== round {r} {v}\nkind size count imm win | ...\n"
        text += ROW_PAGED.format(gbps=gbps) + ROW_IMM.format(p50=p50)
    p = tmp_path / "obs.txt"
    p.write_text(text)
    return str(p)


def test_rows_are_read_per_round_and_variant(ab, tmp_path):
    f = _write(tmp_path, [(1, "off", 1.0, 6.0), (1, "on", 0.9, 6.6), (2, "on", 1.8, 12.0),
                          (2, "off", 2.0, 10.0)])
    d = ab.parse(f)
    assert d["paged 4K"] == {"off": {1: 1.0, 2: 2.0}, "on": {1: 0.9, 2: 1.8}}
    assert d["imm 0"] == {"off": {1: 6.0, 2: 10.0}, "on": {1: 6.6, 2: 12.0}}


def test_ratios_pair_rounds_and_the_interval_holds_the_median(ab, tmp_path, capsys):
    # "on" is exactly 0.9x of "off" in every round while the machine drifts 3.4x.
    rounds = []
    for r in range(1, 13):
        base = 1.0 + 0.2 * r  # every value exact in the rows' decimals
        rounds += [(r, "off", base, 5.0 * base), (r, "on", 0.9 * base, 5.5 * base)]
    assert ab.main([_write(tmp_path, rounds)]) == 0
    out = capsys.readouterr().out
    paged = next(line for line in out.splitlines() if line.startswith("paged 4K") and " on " in line)
    imm = next(line for line in out.splitlines() if line.startswith("imm 0") and " on " in line)
    assert "0.9000 [0.9000, 0.9000]" in paged
    assert "1.1000 [1.1000, 1.1000]" in imm
    lo, hi = ab.boot_median([1.0, 2.0, 3.0, 4.0, 5.0])
    assert 1.0 <= lo <= 3.0 <= hi <= 5.0


def test_no_rounds_is_an_error(ab, tmp_path):
    p = tmp_path / "empty.txt"
    p.write_text("nothing here\n")
    assert ab.main([str(p)]) == 1
