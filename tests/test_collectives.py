"""Collectives (issue 20): systems, stage decompositions, per-link bytes, the α–β kernel.

Hand computations of the stages and routed per-link loads per algorithm; the
numba kernel against its plain-Python twin (``naive_collectives``); the
property that a collective never gets faster when a link gets slower; input
errors and infeasible rows; the accuracy and CLI paths.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

import naive_collectives as naive
from tsbatch.collectives import plan as plan_mod
from tsbatch.collectives.model import evaluate, plans_to_arrays
from tsbatch.collectives.plan import SWITCH, Topology, build_plan, stages_for
from tsbatch.collectives.systems import CALIBRATION_KEYS, get_system, list_systems
from tsbatch.errors import InputError
from tsbatch.kernels.alphabeta import evaluate_rows

REQUIRED_SYSTEMS = {"dgx_a100", "dgx_h100", "hgx_h800", "hgx_h20", "rtx_pro_6000_server",
                    "h200_nvl", "hgx_b200", "b200_ib_cluster", "a100_pcie_nvlink_pairs"}


def _loads_by_name(topo, stage, duplex=False):
    """Per-link loads by link name; the shared both-direction port capacities
    (``duplex/...``, see test_duplex_ports_carry_both_directions) only when asked."""
    return {topo.name(lk): f for lk, f in stage.loads.items()
            if duplex or not topo.name(lk).startswith("duplex/")}


def _costed(system, collective, n, gpn, algorithm, protocol="simple"):
    p = build_plan(system, collective, n, gpn, algorithm, protocol)
    assert p.feasible, p.reason
    (v,) = p.variants
    return p, v


# ------------------------------------------------------------------ systems
def test_issue20_required_systems_exist_and_load():
    assert REQUIRED_SYSTEMS <= set(list_systems())
    for key in list_systems():
        s = get_system(key)
        for k in CALIBRATION_KEYS:
            assert s.sources[f"calibration.{k}"].strip()
        assert s.gpus_per_node >= 1 and s.max_nodes >= 1
    assert get_system("a100_dgx").key == "dgx_a100"
    assert get_system("a100_node").key == "dgx_a100"
    assert get_system("a100_pairwise_nvlink").key == "a100_pcie_nvlink_pairs"
    assert get_system("rtx_pro_6000_server").nvlink is None  # PCIe only
    assert get_system("hgx_h800").nvlink.bw_gbps < get_system("hgx_h20").nvlink.bw_gbps
    assert get_system("h200_nvl").nvlink.topology == "bridged" and not get_system("h200_nvl").nvls
    assert get_system("hgx_b200").nvls and not get_system("dgx_a100").nvls


def test_unknown_system_is_an_input_error():
    with pytest.raises(InputError, match="unknown system 'nope'"):
        get_system("nope")


# ------------------------------------------------------------------ routing
def _classes(topo, links):
    return [topo.cls[lk] for lk in links if not topo.cls[lk].endswith("_duplex")]


def test_routes_follow_the_topology():
    t = Topology(get_system("a100_pcie_nvlink_pairs"), 8, 4)
    assert _classes(t, t.route(0, 1)) == ["nvlink_bridge"]
    # one GPU per root port: the host fabric between root ports is crossed
    assert _classes(t, t.route(1, 2)) == ["pcie", "pcie_uplink", "pcie_uplink", "pcie"]
    assert _classes(t, t.route(0, 4)) == ["net", "net"]
    r = Topology(get_system("rtx_pro_6000_server"), 8, 8)
    assert _classes(r, r.route(0, 1)) == ["pcie", "pcie"]  # same switch: peer-to-peer
    # between switches without P2P (p2p_level = "pxb"): staged through host memory
    assert _classes(r, r.route(0, 2)) == ["pcie", "pcie_uplink", "pcie_uplink", "pcie_shm", "pcie_shm", "pcie"]
    a = Topology(get_system("a100_pcie_nvlink_pairs"), 4, 4)  # P2P through the host (AMD EPYC)
    assert _classes(a, a.route(1, 2)) == ["pcie", "pcie_uplink", "pcie_uplink", "pcie"]
    h = Topology(get_system("h200_nvl"), 8, 8)
    bridge = h.route(0, 3)
    assert _classes(h, bridge) == ["nvlink_bridge"]
    # a 4-way bridge splits the GPU's NVLink over its 3 peers
    sy = get_system("h200_nvl")
    assert h.bw[bridge[0]] == pytest.approx(sy.link_bw_gbps("nvlink") / 3)
    assert _classes(h, h.route(3, 4))[0] == "pcie"


# ------------------------------------------------------------------ stages, hand computations
def test_ring_all_reduce_stages_and_bytes_single_node():
    p, v = _costed("dgx_a100", "all_reduce", 4, 4, "ring")
    assert [s.reps for s in v.stages] == [3, 3]  # n-1 reduce-scatter + n-1 all-gather steps
    assert v.n_stages == 6
    for s in v.stages:
        loads = _loads_by_name(p.topology, s)
        # every GPU sends and receives S/n through its NVSwitch port in every step
        assert loads == {f"nvl_{d}/{g}": pytest.approx(0.25) for d in ("out", "in") for g in range(4)}
    # a GPU's port carries 2 (n-1)/n S in all
    assert sum(s.reps * s.loads[p.topology.ids[("nvl_out", 0)]] for s in v.stages) == pytest.approx(1.5)


def test_ring_across_nodes_uses_one_nic_per_ring():
    p, v = _costed("dgx_a100", "all_reduce", 16, 8, "ring")
    topo = p.topology
    # 8 rings (one per NIC), S/(n*8) each; a node sends S/n per step through 8 distinct NICs
    s = v.stages[0]
    nic_out = {k: f for k, f in _loads_by_name(topo, s).items() if k.startswith("nic_out/0/")}
    assert len(nic_out) == 8
    assert all(f == pytest.approx(1 / (16 * 8)) for f in nic_out.values())
    assert _loads_by_name(topo, s)["node_out/0"] == pytest.approx(1 / 16)
    # a GPU is the exit of one ring of 8 (it sends that ring's share through its NIC):
    # its NVSwitch port carries 7 shares of S/(n*8)
    assert _loads_by_name(topo, s)["nvl_out/3"] == pytest.approx(7 / (16 * 8))
    # the leading chunk crosses 2 node boundaries in 2(n-1) = 30 steps
    inter = [x for x in v.stages if "inter-node" in x.name]
    assert sum(x.reps for x in inter) == 2 and v.n_stages == 30


def test_tree_chain_loads_on_one_node():
    p, v = _costed("dgx_a100", "all_reduce", 4, 4, "tree")
    assert v.pipelined and v.n_stages == 6  # 3 reduce hops, 3 broadcast hops
    merged = v.kernel_stages()
    assert len(merged) == 1
    alpha, reps, loads = merged[0]
    by = {p.topology.name(lk): f for lk, f in loads.items()}
    # chain 3 -> 2 -> 1 -> 0 up, 0 -> 1 -> 2 -> 3 down: middle GPUs send S twice
    assert by["nvl_out/1"] == pytest.approx(2.0) and by["nvl_out/2"] == pytest.approx(2.0)
    assert by["nvl_out/0"] == pytest.approx(1.0) and by["nvl_out/3"] == pytest.approx(1.0)
    assert alpha == pytest.approx(sum(s.alpha_us for s in v.stages))


def test_nvls_loads():
    p, v = _costed("dgx_h100", "all_reduce", 8, 8, "nvls")
    (s,) = v.stages
    by = _loads_by_name(p.topology, s)
    for g in range(8):
        assert by[f"nvl_out/{g}"] == pytest.approx(1 + 1 / 8)
        assert by[f"nvl_in/{g}"] == pytest.approx(1 / 8 + 1)
    assert any(e.dst == SWITCH for e in s.exchanges)


@pytest.mark.parametrize("collective,expected", [
    ("all_reduce", [1.0, 1.0, 1.0]),
])
def test_recursive_doubling_loads(collective, expected):
    p, v = _costed("dgx_a100", collective, 8, 8, "recursive_doubling")
    got = [s.loads[p.topology.ids[("nvl_out", 5)]] for s in v.stages]
    assert got == pytest.approx(expected)
    assert [e.dst for e in v.stages[1].exchanges][:4] == [2, 3, 0, 1]  # partner r xor 2


def test_rabenseifner_loads_halve_then_double():
    p, v = _costed("dgx_a100", "all_reduce", 8, 8, "rabenseifner")
    got = [s.loads[p.topology.ids[("nvl_out", 0)]] for s in v.stages]
    assert got == pytest.approx([1 / 2, 1 / 4, 1 / 8, 1 / 8, 1 / 4, 1 / 2])
    assert sum(got) == pytest.approx(2 * 7 / 8)  # the ring's volume, in log2(n) x 2 stages


def test_all_gather_reduce_scatter_all_to_all_send_recv_loads():
    p, v = _costed("dgx_h100", "all_gather", 4, 4, "ring")
    assert v.n_stages == 3
    assert v.stages[0].loads[p.topology.ids[("nvl_out", 2)]] == pytest.approx(1 / 4)
    p, v = _costed("dgx_h100", "reduce_scatter", 8, 8, "recursive_doubling")
    assert [s.loads[p.topology.ids[("nvl_in", 1)]] for s in v.stages] == pytest.approx([1 / 2, 1 / 4, 1 / 8])
    p = build_plan("dgx_h100", "all_to_all", 4, 4, None, "simple")
    (v,) = p.variants
    assert v.stages[0].loads[p.topology.ids[("nvl_out", 0)]] == pytest.approx(3 / 4)
    p = build_plan("a100_pcie_nvlink_pairs", "send_recv", 2, 2, None, "simple")
    (v,) = p.variants
    assert {p.topology.cls[lk] for lk in v.stages[0].loads} <= {"nvlink_bridge", "nvlink_bridge_duplex"}
    p = build_plan("a100_pcie_nvlink_pairs", "send_recv", 2, 1, None, "simple")
    assert {p.topology.cls[lk] for lk in p.variants[0].stages[0].loads} <= {"net", "net_duplex"}


def test_duplex_ports_carry_both_directions():
    sy = get_system("dgx_a100")
    dup = sy.calibration["duplex_factor"]
    p, v = _costed("dgx_a100", "all_reduce", 4, 4, "ring")
    topo = p.topology
    port = topo.ids[("duplex", "nvl", 2)]
    # GPU 2 sends S/n and receives S/n per step: its port carries both
    assert v.stages[0].loads[port] == pytest.approx(0.5)
    assert topo.bw[port] == pytest.approx(dup * sy.link_bw_gbps("nvlink"))
    # one direction only (send/recv) never reaches the shared capacity
    p = build_plan("dgx_a100", "send_recv", 2, 2, None, "simple")
    loads = p.variants[0].stages[0].loads
    assert max(f / p.topology.bw[lk] for lk, f in loads.items()) == pytest.approx(
        1.0 / sy.link_bw_gbps("nvlink"))


def test_pairwise_ring_bottleneck_is_pcie():
    out = evaluate(pl.DataFrame({"system": ["a100_pairwise_nvlink"], "collective": ["all_reduce"],
                                 "num_gpus": [4], "gpus_per_node": [4], "bytes": [1 << 28],
                                 "algorithm": ["ring"]}))
    assert out["bottleneck_link"][0] == "pcie"


# ------------------------------------------------------------------ infeasible rows, errors
def test_impossible_configurations_are_infeasible_rows():
    df = pl.DataFrame({
        "system": ["h200_nvl", "hgx_b200", "dgx_a100", "dgx_a100", "rtx_pro_6000_server", "dgx_a100"],
        "collective": ["all_reduce", "all_reduce", "all_reduce", "all_gather", "all_reduce", "send_recv"],
        "num_gpus": [8, 16, 6, 4, 4, 4],
        "bytes": [1 << 20] * 6,
        "algorithm": ["nvls", None, "recursive_doubling", "tree", "ring", None],
        "protocol": [None, None, None, None, "ll128", None],
    })
    out = evaluate(df)
    assert not out["feasible"].any()
    reasons = out["infeasible_reason"].to_list()
    assert "in-switch reduction" in reasons[0]
    assert "single node" in reasons[1]
    assert "power-of-two" in reasons[2]
    assert "does not apply" in reasons[3]
    assert "ll128" in reasons[4]
    assert "2 GPUs" in reasons[5]
    assert out["latency_us"].is_nan().all()


@pytest.mark.parametrize("frame,match", [
    (pl.DataFrame({"system": ["dgx_a100"], "collective": ["all_reduce"], "num_gpus": [8]}), "'bytes'"),
    (pl.DataFrame({"system": ["dgx_a100"], "collective": ["allreduce"], "num_gpus": [8], "bytes": [4]}),
     "'collective'"),
    (pl.DataFrame({"system": ["dgx_a100"], "collective": ["all_reduce"], "num_gpus": [8], "bytes": [0]}),
     "'bytes' must be positive"),
    (pl.DataFrame({"system": ["nope"], "collective": ["all_reduce"], "num_gpus": [8], "bytes": [4]}),
     "unknown system"),
    (pl.DataFrame({"system": ["dgx_a100"], "collective": ["all_reduce"], "num_gpus": [8], "bytes": [4],
                   "protocol": ["fast"]}), "'protocol'"),
])
def test_bad_input_names_the_problem(frame, match):
    with pytest.raises(InputError, match=match):
        evaluate(frame)


# ------------------------------------------------------------------ kernel vs naive twin
_SYSTEMS = sorted(REQUIRED_SYSTEMS)
_COLLS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]


@st.composite
def collective_rows(draw):
    n = draw(st.integers(1, 24))
    rows = []
    for _ in range(n):
        sy = draw(st.sampled_from(_SYSTEMS))
        s = get_system(sy)
        coll = draw(st.sampled_from(_COLLS))
        num = 2 if coll == "send_recv" else draw(st.sampled_from([2, 3, 4, 8, 16, 32]))
        gpn = draw(st.sampled_from([1, 2, 4, 8]))
        gpn = min(gpn, num, s.gpus_per_node)
        algo = draw(st.sampled_from([None, None, "ring", "tree", "nvls", "recursive_doubling",
                                     "rabenseifner", "direct"]))
        proto = draw(st.sampled_from([None, None, "ll", "ll128", "simple"]))
        rows.append({"system": sy, "collective": coll, "num_gpus": num, "gpus_per_node": gpn,
                     "bytes": draw(st.integers(1, 1 << 31)), "algorithm": algo, "protocol": proto})
    return pl.DataFrame(rows, schema={"system": pl.String, "collective": pl.String, "num_gpus": pl.Int64,
                                      "gpus_per_node": pl.Int64, "bytes": pl.Int64, "algorithm": pl.String,
                                      "protocol": pl.String})


@given(collective_rows())
def test_kernel_matches_naive_twin(df):
    out = evaluate(df)
    for row, res in zip(df.iter_rows(named=True), out.iter_rows(named=True)):
        p = build_plan(get_system(row["system"]).key, row["collective"], row["num_gpus"],
                       row["gpus_per_node"], row["algorithm"], row["protocol"], None)
        t, v = naive.predict(p, float(row["bytes"]))
        if v is None:
            assert not res["feasible"] and res["infeasible_reason"]
            continue
        assert res["feasible"]
        assert res["latency_us"] == pytest.approx(t, rel=1e-9)
        assert (res["algorithm_used"], res["protocol_used"]) == (v.algorithm, v.protocol)


@given(collective_rows(), st.randoms(use_true_random=False))
def test_row_order_does_not_change_results(df, rnd):
    perm = list(range(df.height))
    rnd.shuffle(perm)
    a = evaluate(df)
    b = evaluate(df[perm])
    for i, j in enumerate(perm):
        x, y = a["latency_us"][j], b["latency_us"][i]
        assert (math.isnan(x) and math.isnan(y)) or x == y


def _arrays_for(df):
    from tsbatch.collectives.model import _KEY, validate

    v = validate(df)
    keys = v.select(_KEY).unique(maintain_order=True)
    plans = [build_plan(r[0], r[1], int(r[2]), int(r[3]), r[4], r[5], None) for r in keys.iter_rows()]
    arrays = plans_to_arrays(plans)
    arrays.pop("var_index")
    plan_of = {r: i for i, r in enumerate(keys.iter_rows())}
    row_plan = np.array([plan_of[r] if plans[plan_of[r]].feasible else -1 for r in v.select(_KEY).iter_rows()])
    return row_plan, v["bytes"].to_numpy().astype(np.float64), arrays


@given(collective_rows(), st.data())
def test_never_faster_when_a_link_gets_slower(df, data):
    row_plan, nbytes, arrays = _arrays_for(df)
    if arrays["link_bw_gbps"].size == 0:
        return
    base = evaluate_rows(row_plan, np.full(len(row_plan), -1), nbytes, **arrays)[0]
    link = data.draw(st.integers(0, arrays["link_bw_gbps"].size - 1))
    factor = data.draw(st.floats(0.05, 1.0))
    slower = dict(arrays)
    slower["link_bw_gbps"] = arrays["link_bw_gbps"].copy()
    slower["link_bw_gbps"][link] *= factor
    after = evaluate_rows(row_plan, np.full(len(row_plan), -1), nbytes, **slower)[0]
    ok = ~np.isnan(base)
    assert np.all(after[ok] >= base[ok] * (1 - 1e-12))


@pytest.mark.parametrize("algorithm,protocol", [("ring", "simple"), ("tree", "ll128"), ("ring", "ll")])
def test_slower_system_links_never_speed_a_forced_collective_up(algorithm, protocol):
    # LL128 on across nodes (a DGX's GPU reaches its NIC within a PCIe switch), so the
    # forced tree/LL128 rows run on two nodes too
    sy = get_system("dgx_a100")
    sy = dataclasses.replace(sy, calibration={**sy.calibration, "net_ll128": 1.0})
    slow = dataclasses.replace(sy, calibration={**sy.calibration, "nvlink_efficiency": 0.3,
                                                "net_efficiency": 0.1})
    df = pl.DataFrame({"system": ["dgx_a100"] * 4, "collective": ["all_reduce"] * 4,
                       "num_gpus": [8, 8, 16, 16], "gpus_per_node": [8, 8, 8, 8],
                       "bytes": [1 << 16, 1 << 26, 1 << 16, 1 << 26],
                       "algorithm": [algorithm] * 4, "protocol": [protocol] * 4})
    orig = plan_mod.get_system

    def run(system):
        plan_mod.build_plan.cache_clear()
        plan_mod.get_system = lambda name: system if name == "dgx_a100" else orig(name)
        try:
            return evaluate(df)["latency_us"].to_numpy()
        finally:
            plan_mod.get_system = orig
            plan_mod.build_plan.cache_clear()

    fast, slower = run(sy), run(slow)
    assert np.isfinite(fast).all()
    assert np.all(slower >= fast)
    assert slower[1] > fast[1]


def test_nccl_choice_moves_from_ll_to_simple_with_size():
    df = pl.DataFrame({"system": ["dgx_h100"] * 3, "collective": ["all_reduce"] * 3, "num_gpus": [8] * 3,
                       "bytes": [4096, 1 << 20, 1 << 30]})
    out = evaluate(df)
    assert out["protocol_used"][0] == "ll"
    assert out["protocol_used"][2] == "simple"
    assert out["latency_us"].is_sorted()
    # the NVLS-capable switch takes the largest message in-switch
    assert out["algorithm_used"][2] == "nvls"


def test_faster_links_give_faster_collectives_across_systems():
    # same shape, vendor specs only differ in NVLink bandwidth: H800 (200 GB/s) < H20 (450 GB/s)
    df = pl.DataFrame({"system": ["hgx_h800", "hgx_h20", "hgx_b200"], "collective": ["all_gather"] * 3,
                       "num_gpus": [8] * 3, "bytes": [1 << 28] * 3})
    lat = evaluate(df)["latency_us"].to_list()
    assert lat[0] > lat[1] > lat[2]


# ------------------------------------------------------------------ accuracy and CLI paths
def test_issue20_accuracy_reads_collective_files(shared_data):
    from tsbatch.measured.accuracy import run_accuracy

    path = shared_data / "collectives" / "vidur_a100_dgx_send_recv.parquet"
    res = run_accuracy([path])
    assert res.skipped["unsupported_family_rows"] == {}
    sc = res.scored
    assert sc.height == pl.read_parquet(path).select("num_gpus", "gpus_per_node", "bytes").unique().height
    assert sc["predicted_us"].is_finite().all() and sc["feasible"].all()
    assert set(sc["gpu"].unique()) == {"a100_dgx"}
    # the latency-bound regime is its own group
    assert set(res.groups["dtype"].to_list()) == {"lt_1MiB", "ge_1MiB"}
    small = sc.filter(pl.col("dtype") == "lt_1MiB")
    assert (small["bytes"] < (1 << 20)).all()


def test_cli_evaluate_writes_and_bad_input_writes_nothing(tmp_path):
    from tsbatch.front.cli import main

    good = tmp_path / "c.parquet"
    pl.DataFrame({"system": ["hgx_b200", "dgx_a100"], "collective": ["all_reduce", "all_gather"],
                  "num_gpus": [8, 4], "bytes": [1 << 24, 1 << 20]}).write_parquet(good)
    out = tmp_path / "o.parquet"
    assert main(["comm", "evaluate", str(good), "-o", str(out)]) == 0
    res = pl.read_parquet(out)
    assert res["feasible"].all() and res.columns[:4] == ["system", "collective", "num_gpus", "bytes"]
    bad = tmp_path / "b.parquet"
    pl.DataFrame({"system": ["dgx_a100"], "collective": ["all_reduce"], "num_gpus": [4]}).write_parquet(bad)
    out2 = tmp_path / "o2.parquet"
    assert main(["comm", "evaluate", str(bad), "-o", str(out2)]) == 2
    assert not out2.exists()


def test_cli_explain_shows_stages_links_and_bottleneck(capsys):
    from tsbatch.front.cli import main

    assert main(["comm", "explain", "--system", "dgx_a100", "--collective", "all_reduce",
                 "--num-gpus", "8", "--bytes", "64MiB", "--algorithm", "ring"]) == 0
    text = capsys.readouterr().out
    assert "reduce-scatter step" in text and "all-gather step" in text
    assert "duplex/nvl/0" in text and "bottleneck link: nvlink" in text
    assert main(["comm", "explain", "--system", "dgx_a100", "--collective", "all_reduce",
                 "--num-gpus", "8", "--bytes", "lots"]) == 2


def test_sweep_ranks_within_workload(tmp_path):
    from tsbatch.collectives.cli import run_sweep

    f = tmp_path / "s.toml"
    f.write_text('family = "collective"\n[fixed]\nsystem = "dgx_h100"\ncollective = "all_reduce"\n'
                 'num_gpus = 8\n[axes]\nbytes = ["64KiB", "256MiB"]\n'
                 'algorithm = ["ring", "tree", "nvls"]\nprotocol = ["ll", "simple"]\n')
    out, meta = run_sweep(f)
    assert out.height == 12
    for _, g in out.group_by("bytes"):
        g = g.sort("rank", nulls_last=True)
        lat = g["latency_us"].drop_nans().drop_nulls()
        assert lat.is_sorted()
        assert g["rank"][0] == 1


def test_comm_sweep_quiet_writes_the_table_and_prints_nothing(tmp_path, capsys):
    # the install-time precompile runs `comm sweep NAME -o OUT -q` for every built-in
    # collective sweep; -q was once rejected there, so those kernels went uncompiled
    import polars as pl

    from tsbatch.front.cli import main

    f = tmp_path / "s.toml"
    f.write_text('family = "collective"\n[fixed]\nsystem = "dgx_h100"\ncollective = "all_reduce"\n'
                 'num_gpus = 8\n[axes]\nbytes = ["64KiB", "256MiB"]\nalgorithm = ["ring", "tree"]\n')
    out = tmp_path / "o.parquet"
    assert main(["comm", "sweep", str(f), "-o", str(out), "-q"]) == 0
    assert capsys.readouterr().out == ""
    assert pl.read_parquet(out).height == 4
    assert main(["comm", "sweep", str(f), "-o", str(out)]) == 0
    assert "wrote 4 ranked rows" in capsys.readouterr().out


def test_precompile_steps_parse():
    # every command line the install-time precompile runs is one the CLI accepts
    import tsbatch._precompile as pc
    from tsbatch.front.cli import build_parser

    seen = []
    real = pc._cli
    pc._cli = lambda *argv: seen.append(argv)
    try:
        for name, step in pc._steps(__import__("pathlib").Path("/nonexistent")):
            if name.startswith(("comm sweep", "sweep", "explain", "comm explain", "simulate")):
                step()
    finally:
        pc._cli = real
    assert any(a[:2] == ("comm", "sweep") for a in seen)
    for argv in seen:
        build_parser(argv[0]).parse_args(list(argv))


def test_empty_frame_and_whole_float_sizes():
    empty = pl.DataFrame(schema={"system": pl.String, "collective": pl.String, "num_gpus": pl.Int32,
                                 "bytes": pl.Int64})
    out = evaluate(empty)
    assert out.height == 0 and "latency_us" in out.columns
    whole = evaluate(pl.DataFrame({"system": ["dgx_h100"], "collective": ["all_reduce"], "num_gpus": [8],
                                   "bytes": [1024.0]}))
    ints = evaluate(pl.DataFrame({"system": ["dgx_h100"], "collective": ["all_reduce"], "num_gpus": [8],
                                  "bytes": [1024]}))
    assert whole["latency_us"][0] == ints["latency_us"][0]
    with pytest.raises(InputError, match="'bytes' has type Float64"):
        evaluate(pl.DataFrame({"system": ["dgx_h100"], "collective": ["all_reduce"], "num_gpus": [8],
                               "bytes": [1.5]}))


def test_gpus_per_node_above_the_job_means_one_node():
    a = evaluate(pl.DataFrame({"system": ["dgx_a100"], "collective": ["all_reduce"], "num_gpus": [2],
                               "gpus_per_node": [8], "bytes": [1 << 24]}))
    b = evaluate(pl.DataFrame({"system": ["dgx_a100"], "collective": ["all_reduce"], "num_gpus": [2],
                               "gpus_per_node": [2], "bytes": [1 << 24]}))
    assert a["feasible"][0] and a["latency_us"][0] == b["latency_us"][0]
    c = evaluate(pl.DataFrame({"system": ["dgx_a100"], "collective": ["all_reduce"], "num_gpus": [2],
                               "gpus_per_node": [1], "bytes": [1 << 24]}))
    assert c["latency_us"][0] > a["latency_us"][0]  # two nodes: through the NICs


# ------------------------------------------------------------------ channels, 2-node tree, buffer window
def test_channel_rule_by_hand():
    """NCCL's enqueue.cc rule: nc = clamp(floor(nBytes / (nt * threadThreshold)), 1, nChannels).

    16 GPUs, 8 per node, ring/Simple forced on dgx_a100 (12 channels, one per NVLink link):
    nt * threshold = 512 * 64 = 32 KiB; 8 rings across the nodes (one per NIC)."""
    p = build_plan("dgx_a100", "all_reduce", 16, 8, "ring", "simple")
    (v,) = p.variants
    assert v.chan_unit == 512 * 64 and v.n_chan == 12
    topo = p.topology
    nic = topo.ids[("nic_out", 0, 7)]  # the NIC of node 0's last GPU: ring 0 leaves there
    for nbytes, k in ((1024, 1), (40 << 10, 1), (64 << 10, 2), (100 << 10, 3), (12 * 32 << 10, 12), (1 << 30, 12)):
        assert naive.nccl_channels(v, nbytes) == k
        line = v.kernel_lines()[v.line_index(float(nbytes))]
        assert line.channels == k
        rings = min(k, 8)
        # every step of every active ring carries 1/(n * rings) of the message over its edges
        step = next(s for s in line.stages if "inter-node" in s.name)
        assert step.loads[nic] == pytest.approx(1 / (16 * rings))
    # tree/LL128 on one node: its cap is nc x perChMaxTreeLL128Bw (20 GB/s on Ampere);
    # nt * threshold = 640 * 8 = 5 KiB
    (t,) = build_plan("dgx_a100", "all_reduce", 8, 8, "tree", "ll128").variants
    assert t.chan_unit == 640 * 8
    assert t.kernel_lines()[t.line_index(3 * 5120.0)].cap_gbps == pytest.approx(3 * 20.0)
    assert t.kernel_lines()[t.line_index(float(1 << 20))].cap_gbps == pytest.approx(12 * 20.0)
    # ring/LL: the threshold is multiplied by the rank count: 512 * 8 * 8 bytes per channel
    (r,) = build_plan("dgx_a100", "all_reduce", 8, 8, "ring", "ll").variants
    assert r.chan_unit == 512 * 8 * 8
    # an all-gather's nBytes is one rank's share: the unit is in whole-buffer bytes
    (g,) = build_plan("dgx_a100", "all_gather", 8, 8, "ring", "ll128").variants
    assert g.chan_unit == 640 * 8 * 8


def test_fewer_channels_are_never_faster_per_byte():
    """Within one variant a line with fewer channels has no smaller slope (fewer rings, lower caps)."""
    p = build_plan("dgx_a100", "all_reduce", 16, 8, "ring", "simple")
    a = plans_to_arrays([p])
    from tsbatch.kernels.alphabeta import _variant_lines

    nl = len(a["line_base_us"])
    la, lb, ll = np.empty(nl), np.empty(nl), np.empty(nl, dtype=np.int64)
    _variant_lines(a["line_base_us"], a["line_stage_ptr"], a["line_proto_eff"], a["line_cap_gbps"],
                   a["stage_alpha_us"], a["stage_reps"], a["stage_load_ptr"], a["load_link"], a["load_frac"],
                   a["link_bw_gbps"], la, lb, ll)
    assert np.all(np.diff(lb) <= 1e-18)


def test_two_node_tree_rated_twice_the_ring_by_nccl():
    """search.cc raises a tree graph's bwIntra up to 2x its bwInter; tuning.cc rates every
    algorithm by bwIntra on <= 2 nodes; ring/Simple latency x1.4 across nodes (plateau)."""
    from tsbatch.collectives import nccl

    p = build_plan("dgx_a100", "all_reduce", 16, 8)
    by = {(v.algorithm, v.protocol): v for v in p.variants}
    ring, tree = by[("ring", "simple")], by[("tree", "simple")]
    bus = plan_mod._ring_bus_bw(p.topology, "all_reduce")
    ch = plan_mod.default_channels(p.system)
    ring_bw = bus * 16 / 30
    tree_bw = min(2 * bus * 0.92, ch * 23.6) * 0.5  # perChMaxTreeBw, Ampere, 2 nodes
    assert 1 / (ring.sel_inv_bw * 1e3) == pytest.approx(ring_bw)
    assert 1 / (tree.sel_inv_bw * 1e3) == pytest.approx(tree_bw)
    lat_no_plateau = (8.4 / 6.6 * p.system.base_latency_us
                      + (30 - 4) * max(3.4, 3 * nccl.NET_OVERHEAD_US) + 4 * 14.0)
    assert ring.sel_lat_us == pytest.approx(1.4 * lat_no_plateau)
    # three nodes: bwInter for both, no factor 2
    p3 = build_plan("dgx_a100", "all_reduce", 24, 8)
    by3 = {(v.algorithm, v.protocol): v for v in p3.variants}
    bus3 = plan_mod._ring_bus_bw(p3.topology, "all_reduce")
    assert 1 / (by3[("tree", "simple")].sel_inv_bw * 1e3) == pytest.approx(min(bus3 * 0.92, ch * 17.8) * 0.5)


def test_two_node_choice_follows_tree_correction_windows():
    """dgx_a100, 4 GPUs at 2 per node: NCCL's tree/Simple correction factor is 0.8 from 8 to
    16 MiB and 0.7 from 16 to 64 MiB; the model runs the tree in the first and the ring in
    the second (as the vidur measurements switch bandwidth at exactly 8 and 16 MiB)."""
    df = pl.DataFrame({"system": ["dgx_a100"] * 4, "collective": ["all_reduce"] * 4, "num_gpus": [4] * 4,
                       "gpus_per_node": [2] * 4, "bytes": [(8 << 20) - 1, 8 << 20, (16 << 20) - 1, 16 << 20]})
    got = evaluate(df)["algorithm_used"].to_list()
    assert got == ["ring", "tree", "tree", "ring"]


def test_network_buffer_window_by_hand():
    """a100_pcie_nvlink_pairs, send/recv across nodes: under NCCL_BUFFSIZE (4 MiB) the message
    crosses the Ethernet at net_burst_efficiency, from 4 MiB on at net_efficiency."""
    sy = get_system("a100_pcie_nvlink_pairs")
    p = build_plan(sy.key, "send_recv", 2, 1)
    v = next(x for x in p.variants if x.protocol == "simple")
    assert v.window_bytes == 4 << 20
    spec = sy.net.bw_gbps
    for nbytes, eff in (((4 << 20) - 4096, sy.cal("net_burst_efficiency")), (4 << 20, sy.cal("net_efficiency"))):
        line = v.kernel_lines()[v.line_index(float(nbytes))]
        (stage,) = line.stages
        serial = max(f * nbytes / (p.topology.bw[lk] * 1e3) for lk, f in stage.loads.items())
        assert serial == pytest.approx(nbytes / (spec * eff * 1e3))
        t, _ = naive.predict(p, float(nbytes))
        assert t == pytest.approx(v.base_us + stage.alpha_us + serial)
    # no window inside a node, nor on a system that calibrates none
    assert all(x.window_bytes == 0 for x in build_plan(sy.key, "send_recv", 2, 2).variants)
    assert all(x.window_bytes == 0 for x in build_plan("dgx_a100", "send_recv", 2, 1).variants)


def test_host_staging_by_hand():
    """dgx_a100 (net_ll128 = 0: the GPU-NIC path is beyond PATH_PXB, so NCCL also turns
    GPUDirect RDMA off and stages network traffic through the CPU, paths.cc): the network
    traffic of the GPUs of one PCIe switch (2 per switch) crosses that switch's staging link.

    4 GPUs at 2 per node, ring/Simple at 32 MiB (all channels: 2 rings, one per NIC the
    node's GPUs reach): per step each ring's inter-node edge carries S/(4*2); both leave
    node 0 from GPUs 0 and 1, i.e. switch 0, so stage_up/0/0 carries 2 S/8 = S/4 per step and
    its both-directions port S/2 (S/4 out, S/4 in), at net_staging_bw_gbps x net_duplex_factor;
    that beats the NIC port (S/8 each way at 0.31 x 25 x 1.52) and the node share (S/4 at 12)."""
    sy = get_system("dgx_a100")
    stage_bw = sy.cal("net_staging_bw_gbps")
    dup = sy.cal("net_duplex_factor")
    nbytes = float(32 << 20)
    p = build_plan(sy.key, "all_reduce", 4, 2, "ring", "simple")
    (v,) = p.variants
    topo = p.topology
    line = v.kernel_lines()[v.line_index(nbytes)]
    for s in line.stages:
        loads = _loads_by_name(topo, s, duplex=True)
        assert loads["stage_up/0/0"] == pytest.approx(1 / 4)
        assert loads["stage_down/0/0"] == pytest.approx(1 / 4)
        assert loads["duplex/stage/0/0"] == pytest.approx(1 / 2)
        assert loads["nic_out/0/0"] == pytest.approx(1 / 8) and loads["nic_out/0/1"] == pytest.approx(1 / 8)
        assert not any(k.startswith("stage_up/0/1") for k in loads)  # GPUs 0, 1: switch 0 only
    per_step = 0.5 * nbytes / (stage_bw * dup * 1e3)
    hand = v.base_us + sum(s.reps * s.alpha_us for s in line.stages) + 6 * per_step
    t, _ = naive.predict(p, nbytes)
    assert t == pytest.approx(hand)
    out = evaluate(pl.DataFrame({"system": [sy.key], "collective": ["all_reduce"], "num_gpus": [4],
                                 "gpus_per_node": [2], "bytes": [int(nbytes)], "algorithm": ["ring"],
                                 "protocol": ["simple"]}))
    assert out["latency_us"][0] == pytest.approx(hand)
    assert out["bottleneck_link"][0] == "net_staging_duplex"
    # 8 GPUs at 4 per node span two switches: the node's traffic splits over both
    p8 = build_plan(sy.key, "all_reduce", 8, 4, "ring", "simple")
    (v8,) = p8.variants
    loads8 = _loads_by_name(p8.topology, v8.kernel_lines()[-1].stages[0])
    assert loads8["stage_up/0/0"] == pytest.approx(loads8["stage_up/0/1"]) == pytest.approx(2 / (8 * 4))


def test_host_staging_only_without_gpudirect():
    """No staging links where LL128 (hence GPUDirect RDMA, same PATH_PXB threshold) is on,
    nor on one node; staging a single GPU per switch (2 at 1 per node) adds a link no
    slower than the NIC's, so the time is the NIC-bound one."""
    sy = get_system("dgx_a100")
    on = dataclasses.replace(sy, calibration={**sy.calibration, "net_ll128": 1.0})
    orig = plan_mod.get_system
    plan_mod.build_plan.cache_clear()
    plan_mod.get_system = lambda name: on if name == sy.key else orig(name)
    try:
        p = build_plan(sy.key, "all_reduce", 4, 2, "ring", "simple")
        assert "net_staging" not in set(p.topology.cls)
    finally:
        plan_mod.get_system = orig
        plan_mod.build_plan.cache_clear()
    assert "net_staging" not in set(build_plan(sy.key, "all_reduce", 8, 8, "ring", "simple").topology.cls)
    assert "net_staging" not in set(build_plan("a100_pcie_nvlink_pairs", "send_recv", 2, 1).topology.cls)
    p2 = build_plan(sy.key, "all_reduce", 2, 1, "ring", "simple")
    (v2,) = p2.variants
    nbytes = float(64 << 20)
    nic_port = sy.net.bw_gbps * sy.cal("net_efficiency") * sy.cal("net_duplex_factor")
    assert sy.cal("net_staging_bw_gbps") * sy.cal("net_duplex_factor") >= nic_port
    line = v2.kernel_lines()[v2.line_index(nbytes)]
    # n = 2: 2 steps, each S/2 out and S/2 in through GPU 0's NIC port
    hand = v2.base_us + sum(s.reps * s.alpha_us for s in line.stages) + 2 * nbytes / (nic_port * 1e3)
    assert naive.predict(p2, nbytes)[0] == pytest.approx(hand)


# ------------------------------------------------------------------ full-mesh node (issue 36)
def test_full_mesh_node_routes_every_pair_directly_and_spreads_the_ring():
    sy = get_system("hgx_h100_4gpu")
    assert get_system("h100_4gpu").key == "hgx_h100_4gpu"
    assert sy.nvlink.topology == "mesh" and not sy.nvls
    assert sy.nvlink.counts["bridge_group"] == 4  # the whole node is one group
    t = Topology(sy, 4, 4)
    # 18 NVLink-4 links x 25 GB/s = 450 GB/s per direction, 6 links (150 GB/s) per pair
    pair_bw = 6 * 25.0 * sy.cal("nvlink_efficiency")
    for a in range(4):
        for b in range(4):
            if a != b:
                r = t.route(a, b)
                assert _classes(t, r) == ["nvlink_bridge"]
                assert t.bw[r[0]] == pytest.approx(pair_bw)
    # ring all-reduce on 4 GPUs: each rank sends S/4 per step, spread over its 3 direct
    # links (the three 4-cycles run both ways): S/12 on every ordered pair
    p, v = _costed("hgx_h100_4gpu", "all_reduce", 4, 4, "ring")
    assert [s.reps for s in v.stages] == [3, 3]
    for s in v.stages:
        loads = _loads_by_name(p.topology, s)
        assert loads == {f"bridge/{a}/{b}": pytest.approx(1 / 12)
                         for a in range(4) for b in range(4) if a != b}
    # 2 GPUs of the node: one pair link, the ordinary 2-rank ring
    p2, v2 = _costed("hgx_h100_4gpu", "all_reduce", 2, 2, "ring")
    assert _loads_by_name(p2.topology, v2.stages[0]) == {"bridge/0/1": pytest.approx(0.5),
                                                        "bridge/1/0": pytest.approx(0.5)}


def test_full_mesh_node_collectives_are_sensible_and_monotone():
    sizes = [1 << k for k in range(10, 31, 2)]
    rows = ([("all_reduce", 2, 4, b) for b in sizes] + [("all_reduce", 4, 4, b) for b in sizes]
            + [("send_recv", 2, 4, b) for b in sizes] + [("send_recv", 2, 2, b) for b in sizes]
            + [("all_gather", 4, 4, b) for b in sizes])
    df = pl.DataFrame({"system": ["hgx_h100_4gpu"] * len(rows), "collective": [r[0] for r in rows],
                       "num_gpus": [r[1] for r in rows], "gpus_per_node": [r[2] for r in rows],
                       "bytes": [r[3] for r in rows]})
    out = evaluate(df)
    lat = out["latency_us"].to_numpy()
    assert np.isfinite(lat).all()
    for i in range(0, len(rows), len(sizes)):
        assert np.all(np.diff(lat[i:i + len(sizes)]) > 0)  # more bytes never faster
    ar2, ar4 = lat[len(sizes) - 1], lat[2 * len(sizes) - 1]
    gib = float(1 << 30)
    sy = get_system("hgx_h100_4gpu")
    eff = sy.cal("nvlink_efficiency")
    # 4-GPU ring bus bandwidth, 2(n-1)/n x S / t, can at most use all 3 links of a GPU
    # (450 GB/s x efficiency) and, using all of them, must beat one pair link (150 GB/s)
    busbw4 = 1.5 * gib / (ar4 * 1e3)
    assert 150.0 * eff < busbw4 <= 450.0 * eff
    # 2 GPUs share one 150 GB/s pair link: a 1 GiB all-reduce is slower than on 4 GPUs
    assert 1.0 * gib / (ar2 * 1e3) <= 150.0 * eff and ar2 > ar4
    # send/recv between two GPUs of the node: one direct pair link at most
    sr = lat[3 * len(sizes) - 1]
    assert gib / (sr * 1e3) <= 150.0 * eff
    assert lat[4 * len(sizes) - 1] == pytest.approx(sr)  # same pair, 2- or 4-GPU job shape


@pytest.mark.parametrize("collective,n", [("all_reduce", 4), ("all_reduce", 2), ("send_recv", 2),
                                          ("all_gather", 4), ("reduce_scatter", 4)])
def test_full_mesh_node_never_faster_with_slower_links(collective, n):
    sy = get_system("hgx_h100_4gpu")
    df = pl.DataFrame({"system": ["hgx_h100_4gpu"] * 4, "collective": [collective] * 4,
                       "num_gpus": [n] * 4, "gpus_per_node": [4] * 4,
                       "bytes": [1 << 12, 1 << 20, 1 << 26, 1 << 30]})
    orig = plan_mod.get_system

    def run(bw):
        s = dataclasses.replace(sy, nvlink=dataclasses.replace(sy.nvlink, bw_gbps=bw))
        plan_mod.build_plan.cache_clear()
        plan_mod.get_system = lambda name: s if name == "hgx_h100_4gpu" else orig(name)
        try:
            return evaluate(df)["latency_us"].to_numpy()
        finally:
            plan_mod.get_system = orig
            plan_mod.build_plan.cache_clear()

    prev = None
    for bw in (900.0, 450.0, 225.0, 100.0):
        cur = run(bw)
        assert np.isfinite(cur).all()
        if prev is not None:
            assert np.all(cur >= prev * (1 - 1e-12))
            assert cur[-1] > prev[-1]  # the 1 GiB row is bandwidth-bound
        prev = cur


def test_engine_accepts_null_and_auto_forcing_columns():
    """Through the engine (``evaluate(..., family="collective")``), a null or ``auto``
    in the optional ``algorithm`` / ``protocol`` columns means "chosen as NCCL does",
    as the collectives model reads them; an empty or unknown text is still an error."""
    from tsbatch.engine.evaluate import evaluate as engine_evaluate

    base = dict(system=["dgx_h100"] * 4, collective=["all_reduce"] * 4, num_gpus=[8] * 4,
                bytes=[1 << 20] * 4)
    t = pl.DataFrame({**base, "algorithm": ["auto", None, "ring", None],
                      "protocol": [None, "auto", "simple", None]})
    got = engine_evaluate(t, "h100", family="collective")
    chosen = engine_evaluate(pl.DataFrame(base), "h100", family="collective")
    for i in (0, 1, 3):  # chosen rows: the same as with no forcing columns at all
        assert got["latency_us"][i] == chosen["latency_us"][i]
        assert got["algorithm_used"][i] == chosen["algorithm_used"][i]
    assert got["algorithm_used"][2] == "ring" and got["protocol_used"][2] == "simple"
    for bad in ("", "bogus"):
        with pytest.raises(InputError, match="column 'algorithm' has unknown value"):
            engine_evaluate(t.with_columns(algorithm=pl.Series([bad, None, "ring", None])),
                            "h100", family="collective")
