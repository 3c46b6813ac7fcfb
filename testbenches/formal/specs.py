"""What is checked formally for each block of hdl/registry.py: the configs (``small`` for
``make test``, ``big`` for ``make formal``), the counting / gate / environment / liveness rules
of :mod:`testbenches.formal.harness`, and the depths (docs/verification.md has the results)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from golden.dense import DenseConfig
from golden.lad_tile import ONE_HEAD_V2, LadTileConfig
from golden.mac_decode import MacDecodeConfig
from golden.mac_unit import MacUnitConfig
from golden.sfm import SfmConfig
from golden.sram import SramConfig
from golden.vpu import VpuConfig, VpuOp
from hdl.lad.eas import Eas

from .harness import Count, Gate, Live, Response


@dataclass(frozen=True)
class Depths:
    """k of the k-induction (``prove``; None: not attempted, it does not close), BMC depth of
    the protocol and counting rules (``bmc``), of the counting rules on the cut model
    (``deep``; None: no cut model), of the liveness check (``live``), of the covers and of the
    BMC that follows the spec's :class:`Prefix` (``prefix``, the prefix's cycles included)."""
    prove: int | None
    bmc: int
    live: int
    cover: int
    deep: int | None = None
    prefix: int | None = None


@dataclass(frozen=True)
class Prefix:
    """A simulated run from reset (testbenches/formal/prefix.py, seeded environment) whose
    inputs the ``prefix`` and ``cover`` tasks follow for ``cycles`` cycles before they are free
    again: for a block whose outputs lie deeper than the solver reaches from reset."""
    cycles: int
    seed: int = 1


@dataclass(frozen=True)
class FormalSpec:
    block: str
    small: object                     # the config of `make test`
    big: object                       # the config of `make formal`
    rules: Callable                   # cfg -> dict(counts=, gates=, responses=, lives=)
    depths: Callable                  # cfg -> Depths
    note: str = ""
    # Cell types cut out of the model for deep / live / cover (Yosys ``cutpoint``: each output a
    # free value every cycle). Sound for the safety checks (the cut model has every behaviour of
    # the real one, and more); a cover reached there counts only when its trace, replayed on the
    # real design (replay.py), reaches it too.
    abstract: tuple = ()
    # The simulated prefix of the ``prefix`` task and of the covers (then on the real model), or
    # cfg -> Prefix where its length depends on the config.
    prefix: Prefix | Callable | None = None

    def prefix_of(self, cfg) -> Prefix | None:
        return self.prefix(cfg) if callable(self.prefix) else self.prefix


# Beats a stall-all pipeline may hold: above the VPU's, SFM's and merge unit's stage counts
# (5, 6 and 2 at the time of writing, changed by retiming), far below unbounded.
PIPELINE_CAP = 8


def _vpu_rules(cfg):
    produces = lambda p: (p.op == VpuOp.AXPY) | p.last   # an AXPY beat or the last beat of a reduction
    return dict(counts=[Count("o", "i", cap=PIPELINE_CAP, in_when=produces)], lives=[Live("i", 1)])


def _sfm_rules(cfg):
    return dict(counts=[Count("o", "i", cap=PIPELINE_CAP)], lives=[Live("i", 1)])


def _sram_rules(cfg):
    counts = [Count(f"read{n}_resp", f"read{n}_req", cap=cfg.read_latency) for n in range(cfg.read_ports)]
    lives = [Live("write", 1)] + [Live(f"read{n}_req", 1) for n in range(cfg.read_ports)]
    return dict(counts=counts, lives=lives)


def _match_rules(cfg):
    return dict(counts=[Count("result", "query", in_per=cfg.beats, cap=1)],
                lives=[Live("query", cfg.window * cfg.beats + 16)])


def _merge_rules(cfg):
    return dict(counts=[Count("o", "i", cap=PIPELINE_CAP)], lives=[Live("i", 24)])


def _unit_rules(cfg):
    match, merge = _match_rules(cfg), _merge_rules(cfg)
    rename = {"query": "match_query", "result": "match_result", "i": "merge_in", "o": "merge_out"}
    counts = [Count(rename[c.out], rename[c.inp], c.in_per, c.out_per, c.cap) for c in match["counts"] + merge["counts"]]
    lives = [Live(rename[lv.inp], lv.bound) for lv in match["lives"] + merge["lives"]]
    return dict(counts=counts, lives=lives)


def _decode_rules(cfg):
    nb = cfg.beats
    assert nb & (nb - 1) == 0, "the burst's beat count is a shift (the harness makes no $mul)"
    position = lambda w: w.query.payload.position < cfg.max_positions
    return dict(assumes=[lambda w: ~w.query.valid | position(w)],
                counts=[Count("out", "query", in_per=nb, out_per=nb + 1, cap=1)],   # d/L beats, then statistics
                gates=[Gate("kv_req", "query", "out", in_per=nb, done_per=nb + 1),
                       Gate("es_req", "query", "out", in_per=nb, done_per=nb + 1)],
                responses=[Response("kv_req", "kv_resp", per=lambda p: p.count << (nb.bit_length() - 1)),
                           Response("es_req", "es_resp", per=lambda p: ~p.write)],   # a write has no response
                lives=[Live("query", 64 * cfg.max_positions * nb + 256)])


def _dense_rules(cfg):
    nb = cfg.beats * cfg.group    # a step: each query head's d/L beats in, the same out
    length = lambda w: (w.query.payload.length >= 1) & (w.query.payload.length <= cfg.max_positions)
    return dict(assumes=[lambda w: ~w.query.valid | length(w)],
                counts=[Count("out", "query", in_per=nb, out_per=nb, cap=1)],
                gates=[Gate("kv_req", "query", "out", in_per=nb, done_per=nb)],
                responses=[Response("kv_req", "kv_resp")],
                lives=[Live("query", 16 * cfg.max_positions * nb + 32)])


def _tile_rules(cfg):
    nb = cfg.beats * cfg.group    # a step: each query head's d/L beats in, the same out
    return dict(counts=[Count("out", "step_in", in_per=nb, out_per=nb, cap=1)],
                gates=[Gate("kv_req", "step_in", "out", in_per=nb, done_per=nb)],
                responses=[Response("kv_req", "kv_resp")],
                lives=[Live("step_in", 40 * cfg.max_positions * nb + 256)])


def _eas_rules(cfg):
    return dict(counts=[Count("key_out", "start", cap=1), Count("approx", "lookup", cap=Eas.lookups_in_flight(cfg))],
                responses=[Response("recip_req", "recip_resp")],
                lives=[Live("start", 8 * cfg.max_centers * cfg.beats + 64), Live("lookup", 8)])


def _apid_rules(cfg):
    heads = [""] if cfg.group == 1 else [f"[{h}]" for h in range(cfg.group)]
    return dict(counts=[Count("smax", "scan", cap=1, in_when=lambda p: p.classify == 0),
                        Count("done", "scan", cap=1, in_when=lambda p: p.classify == 1)],
                responses=[Response("lookup", "approx"),   # per query head of the group: its candidates' verdicts
                           *(Response(f"cand{h}", f"verdict{h}") for h in heads)],
                lives=[Live("scan", 8 * cfg.max_positions + 32), Live("absorb", 8 * cfg.max_positions + 32)])


def _md_rules(cfg):
    nb = cfg.beats
    # per candidate: k_i (nb beats), and v_i too when it is active; nb BEATS commands to AC
    inflight = getattr(cfg, "md_inflight", 1)   # candidates MD holds at once
    return dict(counts=[Count("verdict", "cand", cap=inflight), Count("kv_req", "cand", out_per=2 * nb),
                        Count("corr", "cand", out_per=nb)],
                responses=[Response("kv_req", "kv_resp")],
                lives=[Live("cand", 8 * cfg.beats + 32)])


def _ac_rules(cfg):
    from hdl.lad.common import AcOp
    finish = lambda p: p.op == AcOp.FINISH
    return dict(counts=[Count("out", "cmd", out_per=cfg.beats, cap=1, in_when=finish),
                        Count("recip_req", "cmd", cap=1, in_when=finish)],
                responses=[Response("recip_req", "recip_resp")],
                lives=[Live("cmd", 8 * cfg.beats * cfg.head_dim + 64)])


_TINY_DECODE = MacDecodeConfig(window=2, head_dim=2, heads=1, lanes=1, q_width=4, q_frac=2, score_width=8,
                               score_frac=2, sum_width=14, sum_frac=8, out_width=4, out_frac=2, mantissa_frac=8,
                               band=1, min_context=2, sinks=0, max_positions=4, kv_width=4, kv_frac=2)
_SMALL_DECODE = MacDecodeConfig(window=4, head_dim=4, heads=2, lanes=2, q_width=6, q_frac=3, score_width=10,
                                score_frac=4, sum_width=14, sum_frac=8, out_width=6, out_frac=3, mantissa_frac=8,
                                band=2, min_context=3, sinks=0, max_positions=8, kv_width=6, kv_frac=3)
# one head with keys as centers (the KV-group and compact-center RTL: `ladmac formal BLOCK --set group=3`)
_TINY_LAD = LadTileConfig(head_dim=4, lanes=1, vpus=4, max_positions=4, max_centers=2, **ONE_HEAD_V2)
_SMALL_LAD = LadTileConfig(head_dim=8, lanes=2, vpus=5, max_positions=8, max_centers=4, **ONE_HEAD_V2)
_TINY_MAC = MacUnitConfig(window=2, head_dim=2, heads=1, lanes=1, q_width=4, q_frac=2, score_width=8,
                          score_frac=2, sum_width=8, sum_frac=4, out_width=4, out_frac=2, mantissa_frac=8)
_SMALL_MAC = MacUnitConfig(window=4, head_dim=4, heads=2, lanes=2, q_width=6, q_frac=3, score_width=10,
                           score_frac=4, sum_width=12, sum_frac=6, out_width=6, out_frac=3, mantissa_frac=8)


_FSM_NOTE = ("k-induction does not close at small k (unreachable FSM / counter states); liveness: one step "
             "is longer than the BMC reaches")

# Datapath cells cut for the larger blocks: multipliers and variable shifts (see FormalSpec.abstract).
CUT = ("$mul", "$shl", "$shr", "$sshl", "$sshr", "$shift", "$shiftx")


def _tile_run(cfg) -> int:
    """Cycles of the LAD tile's simulated run (its prefix and covers): 224 at one head, 260 more a
    further head of a KV group."""
    return 224 + 260 * (cfg.group - 1)


def _d(prove, bmc, live, cover, deep=None, prefix=None):
    return lambda cfg: Depths(prove, bmc, live, cover, deep, prefix)


SPECS: dict[str, FormalSpec] = {s.block: s for s in [
    FormalSpec("vpu", VpuConfig(lanes=2, in_width=4, acc_width=10, axpy_shift=3),
               VpuConfig(lanes=4, in_width=8, acc_width=20, axpy_shift=7), _vpu_rules, _d(2, 14, 8, 12)),
    FormalSpec("sfm", SfmConfig(x_width=8, x_frac=4, coef_frac=8, out_width=8, out_frac=7, intervals=2, cutoff=-4.0,
                                recip_in_width=6, table_index_bits=2, table_delta_bits=2, mantissa_frac=8),
               SfmConfig(x_width=12, x_frac=7, coef_frac=12, out_width=12, out_frac=11, intervals=4, cutoff=-8.0,
                         recip_in_width=12, table_index_bits=4, table_delta_bits=4, mantissa_frac=10),
               _sfm_rules, _d(2, 16, 8, 14)),
    # big: the registered-address read (a fixed-latency pipeline into an output FIFO); its
    # k-induction does not close (unreachable FIFO pointer / count states), BMC bounds it
    FormalSpec("sram", SramConfig(depth=4, width=4, read_ports=2, read_latency=2),
               SramConfig(depth=16, width=8, read_ports=4, read_latency=4, address_register=True), _sram_rules,
               lambda cfg: Depths(None if cfg.address_register else 2, 12, 8, 10),
               note="k-induction of the registered-address read does not close at small k (unreachable output "
                    "FIFO states); BMC bounds it"),
    FormalSpec("mac-match", _TINY_MAC, _SMALL_MAC, _match_rules, _d(2, 20, 24, 20)),
    FormalSpec("mac-merge", _TINY_MAC, _SMALL_MAC, _merge_rules, _d(2, 24, 28, 24)),
    FormalSpec("mac-unit", _TINY_MAC, _SMALL_MAC, _unit_rules, _d(2, 24, 28, 24)),
    FormalSpec("dense", DenseConfig(head_dim=4, lanes=1, max_positions=2, kv_width=6, kv_frac=3),
               DenseConfig(head_dim=8, lanes=2, max_positions=4, kv_width=8, kv_frac=4), _dense_rules,
               # out first done at step 62; a KV group's further heads' query and out beats push it later
               lambda cfg: Depths(None, 20, None, 64 + 16 * (cfg.group - 1), 44), abstract=CUT, note=_FSM_NOTE),
    # prefix: the first step's query and K pass (its entry-store requests at cycle 76 of the run,
    # its last out beat at 88); the second step's query at 89, its K pass free (its kv_req stalled at 97)
    FormalSpec("mac-decode", _TINY_DECODE, _SMALL_DECODE, _decode_rules,
               _d(None, 12, None, 100, deep=24, prefix=100), abstract=CUT, note=_FSM_NOTE, prefix=Prefix(60, seed=1)),
    # prefix: step 0 (its out at cycles 111-115 of the run) and step 1 up to its candidates' KV
    # reads (kv_req from 218, one stalled at 222): every cover in the run; the solver checks every
    # continuation for 24 cycles more (the covers' task is the run alone: a solver's cover search
    # along it did not finish, docs/verification.md). At one head; a KV group's heads take longer a
    # step (their loads and outputs, their modules in turn on the SFM): at group 3 step 1's first KV
    # read is at cycle 720, one stalled at 724
    FormalSpec("lad-tile", _TINY_LAD, _SMALL_LAD, _tile_rules,
               lambda cfg: Depths(None, 12, None, _tile_run(cfg), 30, _tile_run(cfg) + 24),
               abstract=CUT, note=_FSM_NOTE, prefix=lambda cfg: Prefix(_tile_run(cfg), seed=1)),
    FormalSpec("lad-eas", _TINY_LAD, _SMALL_LAD, _eas_rules, _d(None, 2, None, 32, deep=24), abstract=CUT,
               note=_FSM_NOTE),
    FormalSpec("lad-apid", _TINY_LAD, _SMALL_LAD, _apid_rules, _d(None, 10, None, 12, deep=16), abstract=CUT,
               note=_FSM_NOTE),
    # on the cut model a candidate's verdict is first taken at step 24, its corrections' first
    # beat stalled at 30 and first unit done at 32 (covers at 34; deep 32: steps 0..31)
    FormalSpec("lad-md", _TINY_LAD, _SMALL_LAD, _md_rules, _d(None, 12, None, 34, deep=32), abstract=CUT,
               note=_FSM_NOTE),
    FormalSpec("lad-ac", _TINY_LAD, _SMALL_LAD, _ac_rules, _d(None, 5, None, 20, deep=30), abstract=CUT,
               note=_FSM_NOTE),
]}
