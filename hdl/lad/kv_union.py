"""One KV port for the query heads of a KV group (docs/lad-tile.md, "Compact centers and a tile per
KV group"): each head's KV requests (its MD's ``kv_req``, in that head's own order) in, one stream
to the KV memory out, a request issued once for every head whose next request it is; the in-order
responses go back to the heads that asked (a FIFO of each request's heads, ``inflight`` deep),
each head taking its copy when it is ready.

Each head's request and its response pass a :class:`hdl.lib.slice.RegisterSlice`, so no head's
request logic reaches another head's, or the choice below, in the same cycle (without them one
head's request position ran through the compares and the other heads' ``ready`` into their
issue logic: 48 MHz estimated on the LFE5U-85F, docs/lad-tile.md, "A group of 3 on the LFE5U-85F").

The request issued is the least ``(position, value, beat)`` among the heads' next requests, so a
head ahead of the others waits for them to reach its position: where the heads' requests ascend
(APID hands a group's heads their candidates in position order) and are all presented, a key or
value beat that several heads need is read once, the union of their reads. Each head's requests
still leave in its own order, and its responses come back in that order: every head sees exactly
its own request / response stream.
"""
from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ..lib.slice import RegisterSlice


class KvUnion(wiring.Component):
    """``req[h]`` -> ``kv_req``; ``kv_resp`` -> ``resp[h]`` of the heads that asked."""

    def __init__(self, request_layout, response_layout, heads: int, inflight: int):
        if heads < 2 or inflight < 1:
            raise ValueError(f"KvUnion needs 2 or more heads and 1 or more requests in flight, got {heads}, {inflight}")
        self.heads, self.inflight = heads, inflight
        super().__init__({
            "req": In(stream.Signature(request_layout)).array(heads),
            "resp": Out(stream.Signature(response_layout)).array(heads),
            "kv_req": Out(stream.Signature(request_layout)),
            "kv_resp": In(stream.Signature(response_layout)),
        })

    def elaborate(self, platform):
        m, g = Module(), self.heads
        m.submodules.tags = tags = SyncFIFO(width=g, depth=self.inflight)   # the heads of each request in flight
        reqs, resps = [], []
        for h in range(g):
            m.submodules[f"req_slice{h}"] = req_slice = RegisterSlice(self.req[h].payload.shape())
            m.submodules[f"resp_slice{h}"] = resp_slice = RegisterSlice(self.resp[h].payload.shape())
            wiring.connect(m, wiring.flipped(self.req[h]), req_slice.i)
            wiring.connect(m, resp_slice.o, wiring.flipped(self.resp[h]))
            reqs.append(req_slice.o)
            resps.append(resp_slice.i)
        valid = [r.valid for r in reqs]
        order = [Cat(r.payload.beat, r.payload.value, r.payload.position) for r in reqs]   # position most significant
        # head h's request is the least of those presented, so the heads asking are those whose
        # request equals the least (ties: equal requests, all taken at once)
        least = [valid[h] & Cat(*(~valid[j] | (order[h] <= order[j]) for j in range(g) if j != h)).all()
                 for h in range(g)]
        pick = Signal(range(g))   # the first head holding the least request
        for h in reversed(range(g)):
            with m.If(least[h]):
                m.d.comb += pick.eq(h)
        # a request offered and not taken stays as it was (a head that presents a lesser one
        # meanwhile waits): the choice is held while the KV memory stalls
        stalled = Signal()
        m.d.sync += stalled.eq(self.kv_req.valid & ~self.kv_req.ready)
        held_first, held_asked = Signal(range(g)), Signal(g)
        first, asked = Signal(range(g)), Signal(g)
        m.d.comb += [first.eq(Mux(stalled, held_first, pick)),
                     asked.eq(Mux(stalled, held_asked, Cat(*least)))]
        m.d.sync += [held_first.eq(first), held_asked.eq(asked)]
        m.d.comb += [self.kv_req.valid.eq(Cat(*valid).any() & tags.w_rdy), self.kv_req.payload.eq(reqs[0].payload)]
        for h in range(1, g):
            with m.If(first == h):
                m.d.comb += self.kv_req.payload.eq(reqs[h].payload)
        issue = self.kv_req.valid & self.kv_req.ready
        m.d.comb += [tags.w_en.eq(issue), tags.w_data.eq(asked),
                     *(r.ready.eq(issue & asked[h]) for h, r in enumerate(reqs))]
        # responses, in request order: to every head of the oldest tag; it leaves when all of them
        # have taken it (a head that took it is flagged and offered it no more)
        tag = tags.r_data
        delivered = Signal(g)
        took = Cat(*(r.valid & r.ready for r in resps))
        m.d.comb += self.kv_resp.ready.eq(tags.r_rdy & ((delivered | took | ~tag) == (1 << g) - 1))
        m.d.comb += tags.r_en.eq(self.kv_resp.valid & self.kv_resp.ready)
        for h, r in enumerate(resps):
            m.d.comb += [r.valid.eq(self.kv_resp.valid & tags.r_rdy & tag[h] & ~delivered[h]),
                         r.payload.eq(self.kv_resp.payload)]
        with m.If(self.kv_resp.valid & self.kv_resp.ready):
            m.d.sync += delivered.eq(0)
        with m.Else():
            m.d.sync += delivered.eq(delivered | took)
        return m
