"""group_norm (NCHW, affine): a group of sample n is a contiguous run of (C/G) x HxW elements.

CUDA modes:
  split    the group cut into CHUNK-element pieces; kernel 1 writes each piece's count/mean/M2
           into the caller's workspace; kernel 2 merges its group's pieces (Chan's formula) and
           normalises one piece of one channel plane with the per-channel affine. Two reads of the
           input and one write; with ORDER=reverse kernel 2 starts where kernel 1 ended, in L2.
  cluster  one pass: a thread-block cluster of CL blocks (sm_90) holds a group in registers; the
           sum, then the sum of squared deviations (exact two-pass variance), meet in distributed
           shared memory; each block writes its part. For groups that fit the cluster's registers.
  stash    one read from DRAM: a cluster of CL blocks per group, each block keeping the first part
           of its segment in shared memory (a buffer that also caps the blocks per SM at BPS, so the
           groups in flight fit L2) and re-reading the rest from L2 to normalise. Statistics per
           thread (sums around a pivot), merged with Chan's formula in the block and the cluster.
  stream   one launch, no cluster: blocks take work items in order from a ticket counter; the items
           are the statistics of piece p of group g and, AHEAD groups later in the order, the
           normalisation of that piece, which waits (spinning on the group's count of finished
           pieces) for the group's statistics. Reads of new groups and writes of finished ones
           overlap all the time; the second read of a piece comes AHEAD groups after the first,
           from L2 when AHEAD groups fit it.
  ring     one DRAM read, persistent: a cluster of CL blocks walks groups (cid, cid + clusters, ...),
           each block keeping its segment of the group in shared memory (the part that fits
           BPS blocks an SM; any rest is read twice, the second time from L2). LOAD=bulk: the segment
           arrives in chunks by bulk copies (TMA), one mbarrier a chunk, the statistics of a chunk
           starting as it lands; once the block has stored a group, the next group's chunks are
           requested while those stores drain. LOAD=thread: each thread stages its own elements of
           the next group (cp.async) as soon as it has written them for this one.

The CUDA code is in group_norm.cuh (device) and group_norm.cu (entry points), the C++ in
group_norm.cpp.
"""

from __future__ import annotations

from ...cards import Card, CardKind
from ...kernel_abi import CPU_CTYPE, ITEMSIZE
from ...kernels.common import CPU_COMMON, CUDA_COMMON
from ...kernels.device import DEFAULT_DEVICE, DeviceProps
from ...kernels.family import Family, Match, header
from ...kernels.launch import ring_launch, stream_counters, stream_ws_bytes, workspace_entry
from ...kernels.source import KernelFile
from ..base import (
    CTYPE,
    FLOAT_DTYPES,
    cluster_axes,
    cluster_fits,
    cluster_mode_ok,
    input_index,
    ring_cap,
    ring_stash,
    stash_bytes,
    stream_ahead,
    vec_widths,
)

CUH = KernelFile(__package__, "group_norm.cuh")
CU = KernelFile(__package__, "group_norm.cu")
CPP = KernelFile(__package__, "group_norm.cpp")


class GroupNorm(Family):
    name = "group_norm"

    def match(self, card: Card) -> Match | None:
        if card.kind != CardKind.OP or card.target != "aten.native_group_norm.default" or len(card.outputs) != 3:
            return None
        a = card.program["nodes"][0]["args"]
        xi, wi, bi = input_index(a[0]), input_index(a[1]), input_index(a[2])
        n, c, hw, g, eps = a[3], a[4], a[5], a[6], a[7]
        if xi is None or not all(isinstance(v, int) for v in (n, c, hw, g)) or c % g:
            return None
        x = card.inputs[xi]
        if x.dtype not in FLOAT_DTYPES or not x.contiguous or not card.outputs[0].contiguous:
            return None
        return Match(self.name, card, {
            "x": xi, "w": wi, "b": bi, "n": n, "c": c, "hw": hw, "g": g, "eps": float(eps), "tin": x.dtype,
            "tw": card.inputs[wi].dtype if wi is not None else x.dtype,
            "tb": card.inputs[bi].dtype if bi is not None else x.dtype,
            "tout": card.outputs[0].dtype, "tstat": card.outputs[1].dtype,
            "group_len": (c // g) * hw})

    def _vecs(self, m: Match) -> list[int]:
        return vec_widths(m.info["hw"], ITEMSIZE[m.info["tin"]])

    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        if backend == "cpu":
            return {"chunk": [1, 2, 4]}
        ax: dict[str, list] = {"mode": ["ring", "stream", "stash", "cluster", "split"],
                               "chunk": [2048, 4096, 8192, 16384, 32768, 65536],
                               "threads": [128, 256, 512, 1024], "vec": self._vecs(m), "order": ["reverse", "forward"],
                               "cl": [2, 4, 8, 16], "bps": [1, 2, 4], "ahead": [2, 4, 8, 16, 32], "load": ["bulk", "thread"]}
        return cluster_axes(ax, device)

    def valid(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        if backend == "cpu":
            return True
        if p["vec"] not in self._vecs(m):
            return False
        if not cluster_mode_ok(p, device):
            return False
        if p.get("mode") == "cluster":
            return cluster_fits(m.info["group_len"], p["cl"], p["threads"], p["vec"])
        if p.get("mode") == "ring":
            glen, itemsize = m.info["group_len"], ITEMSIZE[m.info["tin"]]
            if glen % (p["cl"] * p["vec"]) or (glen // p["cl"] * itemsize) % 16 \
                    or p["threads"] * p["bps"] > device.max_threads_per_sm:
                return False  # (bulk copies move multiples of 16 bytes from 16-byte boundaries)
            return ring_stash(glen // p["cl"], itemsize, p["threads"] * p["vec"], p["bps"], device) > 0
        if p.get("mode") == "stash":
            glen = m.info["group_len"]
            return glen % (p["cl"] * p["vec"]) == 0 and glen // p["cl"] >= p["threads"] * p["vec"] and \
                p["threads"] * p["bps"] <= device.max_threads_per_sm and \
                stash_bytes(p["bps"], device) + 1024 <= device.smem_per_block  # (1 KB of static shared memory)
        if p.get("mode") == "stream":
            return (p["chunk"] % (p["threads"] * p["vec"]) == 0 and m.info["group_len"] % p["chunk"] == 0
                    and p["ahead"] <= m.info["n"] * m.info["g"])
        return p["chunk"] % (p["threads"] * p["vec"]) == 0

    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        if backend == "cpu":
            return {"chunk": 1}
        vec = self._vecs(m)[0]
        total = m.info["n"] * m.info["c"] * m.info["hw"]
        chunk = 16384
        while chunk > 2048 and total // chunk < 4 * device.sms:
            chunk //= 2
        ng = m.info["n"] * m.info["g"]
        gbytes = m.info["group_len"] * ITEMSIZE[m.info["tin"]]
        # the stream mode's normalising read of a piece comes AHEAD groups after its first read:
        # those groups' inputs should take about a quarter of L2, which holds their outputs too
        ahead = stream_ahead(ng, gbytes, (2, 4, 8, 16, 32), device.l2_bytes * 4 // 15)
        base = {"mode": "split", "chunk": max(chunk, 256 * vec), "threads": 256, "vec": vec, "order": "reverse",
                "cl": 8, "bps": 2, "ahead": ahead, "load": "bulk"}
        groups = m.info["n"] * m.info["g"]
        # The first choice, in this order (docs/benchmarks.md has the measurements behind it):
        # - the persistent ring (_ring), for groups of 512 KB and more (a sixteenth of at least
        #   32 KB) and enough of them for every SM: one DRAM read, the next group's loads
        #   overlapping this group's stores;
        # - the stash, where a block's shared memory holds at least half of its eighth of a group:
        #   one DRAM read (holding less, a block re-reads most of its segment from L2, and split is
        #   as fast);
        # - a cluster holding the group in registers, where enough groups fill the GPU;
        # - else split. The stream mode stays a move.
        # The ring, the stash and the cluster need thread-block clusters (valid() checks).
        stash = {**base, "mode": "stash", "cl": 8, "threads": 1024, "bps": 2}
        seg_bytes = m.info["group_len"] // 8 * ITEMSIZE[m.info["tin"]]
        ring = {**base, **self._ring(m, device)}
        if gbytes >= 512 << 10 and groups * 16 >= device.sms and self.valid(m, ring, backend, device):
            return ring
        if groups * 8 >= device.sms and 2 * stash_bytes(2, device) >= seg_bytes and self.valid(m, stash, backend, device):
            return stash
        for cl, threads in ((8, 1024), (8, 512), (4, 1024), (4, 512)):
            cluster = {**base, "mode": "cluster", "cl": cl, "threads": threads}
            if groups * cl >= device.sms and self.valid(m, cluster, backend, device):
                return cluster
        return base

    def _ring(self, m: Match, device: DeviceProps) -> dict:
        """The ring's settings: clusters of 16 at 512 threads, each thread staging its own elements
        (cp.async) as it writes them; three blocks an SM where a sixteenth of a group fits a block's
        share of shared memory at three, else two."""
        seg, itemsize = m.info["group_len"] // 16, ITEMSIZE[m.info["tin"]]
        bps = 3 if ring_cap(itemsize, 3, device) >= seg else 2
        return {"mode": "ring", "cl": 16, "threads": 512, "bps": bps, "load": "thread"}

    def mode_settings(self, m: Match, mode: str, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        """Settings for a move into ``mode``: the stream mode at 512 threads a block (its registers
        spill at 1024, and 256 is slower), the stash at 1024 in clusters of 8 at two blocks an SM,
        the ring as _ring, split at 512 and the cluster at 1024 in clusters of 8."""
        if backend == "cpu":
            return {}
        if mode == "ring":
            return {k: v for k, v in self._ring(m, device).items() if k != "mode"}
        return {"stream": {"threads": 512}, "stash": {"threads": 1024, "bps": 2, "cl": 8},
                "cluster": {"threads": 1024, "cl": 8}, "split": {"threads": 512}}.get(mode, {})

    def relevant(self, p: dict) -> dict:
        """The parameters that change the kernel (chunk and order only split, cl the cluster modes,
        bps only stash and ring)."""
        q = dict(p)
        if q.get("mode") in ("cluster", "stash", "ring"):
            q.pop("chunk", None)
            q.pop("order", None)
        elif "mode" in q:
            q.pop("cl", None)
        if q.get("mode") not in ("stash", "ring"):
            q.pop("bps", None)
        if q.get("mode") != "ring":
            q.pop("load", None)
        if q.get("mode") != "stream":
            q.pop("ahead", None)
        if q.get("mode") == "stream":
            q.pop("order", None)
        return q

    def passes(self, m: Match, p: dict) -> int:
        """Reads of the input from DRAM (the stash's second read comes from shared memory and L2)."""
        return 1 if p.get("mode") in ("cluster", "stash", "stream", "ring") else 2

    def render(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        return header(self.name, p, 2) + (self._cpu(m, p) if backend == "cpu" else self._cuda(m, p, device))

    def _cpu(self, m: Match, p: dict) -> str:
        i, ct = m.info, CPU_CTYPE
        return CPU_COMMON + CPP.fill(
            "entry", tx=ct[i["tin"]], tw=ct[i["tw"]], tb=ct[i["tb"]], to=ct[i["tout"]], ts=ct[i["tstat"]], n=i["n"],
            c=i["c"], hw=i["hw"], g=i["g"], cpg=i["c"] // i["g"], x=i["x"], chunk=p["chunk"], eps=f"(float){i['eps']!r}",
            w_ptr="const TW* w = (const TW*)in[%d].data;" % i["w"] if i["w"] is not None else "",
            b_ptr="const TB* b = (const TB*)in[%d].data;" % i["b"] if i["b"] is not None else "",
            w_expr="to_f(w[ch])" if i["w"] is not None else "1.f", b_expr="to_f(b[ch])" if i["b"] is not None else "0.f")

    def _cuda(self, m: Match, p: dict, device: DeviceProps) -> str:
        i, ct = m.info, CTYPE
        threads, vec = p["threads"], p["vec"]
        glen = i["group_len"]
        ng = i["n"] * i["g"]
        cpg = i["c"] // i["g"]
        ptrs = {"w": f"(const TW*)in[{i['w']}].data" if i["w"] is not None else "(const TW*)nullptr",
                "b": f"(const TB*)in[{i['b']}].data" if i["b"] is not None else "(const TB*)nullptr",
                "glen": glen, "hw": i["hw"], "g": i["g"], "cpg": cpg, "eps": f"(float){i['eps']!r}"}
        common = {"types": CU.inline("types", tx=ct[i["tin"]], tw=ct[i["tw"]], tb=ct[i["tb"]], to=ct[i["tout"]],
                                     ts=ct[i["tstat"]]),
                  "check": CU.fill("check", x=i["x"], vec=vec), "total": ng * glen, "threads": threads, "vec": vec}
        mode = p.get("mode")
        if mode == "cluster":
            cl = p["cl"]
            seg = glen // cl
            return CUDA_COMMON + CUH.section("kernels") + CU.fill(
                "cluster", **common, cl=cl, nv=-(-seg // (threads * vec)), nv1=-(-seg // threads), blocks=ng * cl,
                args=CU.inline("args", **ptrs))
        if mode == "stash":
            cl, smem = p["cl"], stash_bytes(p["bps"], device)
            stash = min(glen // cl, smem // ITEMSIZE[i["tin"]]) // vec * vec
            return CUDA_COMMON + CUH.section("kernels") + CUH.section("stash") + CU.fill(
                "stash", **common, cl=cl, smem=smem, blocks=ng * cl, args=CU.inline("args", **ptrs), stash=stash)
        if mode == "ring":
            cl = p["cl"]
            stash = ring_stash(glen // cl, ITEMSIZE[i["tin"]], threads * vec, p["bps"], device)
            smem = stash * ITEMSIZE[i["tin"]]
            args = CU.inline("args", **ptrs) + f", {stash}, (int)NG"
            bulk = "true" if p.get("load", "bulk") == "bulk" else "false"
            k_vec = CU.inline("ring_kernel", cl=cl, threads=threads, vec=vec, bulk=bulk)
            k_one = CU.inline("ring_kernel", cl=cl, threads=threads, vec=1, bulk="false")
            return CUDA_COMMON + CUH.section("kernels") + CUH.section("ring") + CU.fill(
                "ring", **common, ng=ng, launch_vec=ring_launch(k_vec, "NG", cl, threads, smem, args),
                launch_one=ring_launch(k_one, "NG", cl, threads, smem, args))
        if mode == "stream":
            chunk = p["chunk"]
            # 1024 threads an SM: loads enough in flight, and few items in flight, so that AHEAD groups
            # cover them and the normalising reads come while the pieces are still in L2
            grid = device.sms * max(1, 1024 // threads)
            return CUDA_COMMON + CUH.section("kernels") + CUH.section("stream") + CU.fill(
                "stream", **common, ng=ng, pieces=glen // chunk, chunk=chunk, ahead=p["ahead"], grid=grid,
                ws_bytes=stream_ws_bytes("(int64_t)sizeof(float) * NG * PIECES * 3", "NG"),
                entry=workspace_entry("WS_BYTES"), counters=stream_counters("NG"), args=CU.inline("stream_args", **ptrs))
        chunk = p["chunk"]
        pieces = -(-glen // chunk)
        unroll = 4
        per_plane = -(-i["hw"] // (threads * vec * unroll))
        per_plane1 = -(-i["hw"] // (threads * unroll))
        planes = i["n"] * i["c"]
        return CUDA_COMMON + CUH.section("kernels") + CU.fill(
            "split", **common, ng=ng, glen=glen, pieces=pieces, entry=workspace_entry("WS_BYTES"), chunk=chunk,
            unroll=unroll, rev="true" if p.get("order", "reverse") == "reverse" else "false",
            blocks=planes * per_plane, blocks1=planes * per_plane1, per_plane=per_plane, per_plane1=per_plane1,
            args=CU.inline("split_args", **dict(ptrs, pieces=pieces, c=i["c"])))
