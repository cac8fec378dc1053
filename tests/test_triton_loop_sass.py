"""bench/triton_loop_sass.py's load_overlap on hand-written loop bodies (no
Triton needed): the HMMAs between each global load and the shared store of its
register, round the loop's back edge."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import triton_loop_sass as tls  # noqa: E402


def test_prefetch_counts_the_mmas_under_the_load():
    # next step's loads before this step's two HMMAs, stores after them
    body = ["LDSM.16.M88.4 R16, [R38]", "LDG.E.128 R4, [R56.64]", "BAR.SYNC.DEFER_BLOCKING 0x0",
            "LDG.E.128 R8, [R54.64]", "HMMA.16816.F32 R20, R16, R18, R20",
            "HMMA.16816.F32 R24, R16, R19, R24", "STS.128 [R49], R4", "STS.128 [R49+0x400], R8",
            "BAR.SYNC.DEFER_BLOCKING 0x0"]
    assert tls.load_overlap(body) == [2, 2]


def test_store_right_behind_its_load_has_none():
    body = ["HMMA.1688.F32.TF32 R20, R12, R16, R20", "LDG.E.128 R4, [R56.64]",
            "STS.128 [R49], R4", "BAR.SYNC.DEFER_BLOCKING 0x0", "LDS R12, [R45]"]
    assert tls.load_overlap(body) == [0]


def test_store_before_its_load_wraps_round_the_back_edge():
    # the store's register was loaded by the previous iteration's tail
    body = ["STS.128 [R49], R4", "BAR.SYNC.DEFER_BLOCKING 0x0", "HMMA.1688.F32.TF32 R20, R12, R16, R20",
            "LDG.E.128 R4, [R56.64]", "HMMA.1688.F32.TF32 R24, R12, R17, R24",
            "@P0 HMMA.1688.F32.TF32 R28, R13, R17, R28"]
    assert tls.load_overlap(body) == [2]


def test_nearest_load_of_the_register_counts_and_unloaded_stores_are_skipped():
    body = ["LDG.E.128 R4, [R56.64]", "HMMA.16816.F32 R20, R16, R18, R20", "LDG.E.128 R4, [R56.64+0x40]",
            "STS.128 [R49], R4", "STS [R50], R60"]
    assert tls.load_overlap(body) == [0]
